// A loaded decoder-only Llama-family model and its forward passes: batched prefill,
// single-token decode and teacher-forced NLL, all appending to a caller-owned KvCache.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/cpu/panels.h"

namespace riskkv {

struct ModelOptions {
  int threads = 0;  // CPU threads for the backend; <= 0 uses every hardware thread
  // kInt8 (llama.cpp's arithmetic, faster) or kF32 (exact: the oracle the golden tests and
  // other backends are checked against). Only quantized weights are affected.
  ActivationPrecision activations = ActivationPrecision::kInt8;
  // The matrices regrouped in panels (kernels/cpu/panels.h) for products with the same bits at
  // about twice the speed: quantized ones with kInt8 (AVX-512 VNNI or AVX2 kernel, chosen at run
  // time), F16 and BF16 ones always. The file's pages of a packed matrix leave the resident set, so
  // memory stays about that of the file. Off: the row kernels alone.
  bool cpu_panels = true;
};

// Receives, for one layer, the normalised attention input (the output of the layer's input
// RMSNorm, i.e. the input of its Q/K/V projections) for positions [pos0, pos0 + n):
// attn_in is [n, hidden] f32, valid only during the call.
using AttnInputHook =
    std::function<void(int64_t layer, int64_t pos0, int64_t n, const float* attn_in)>;

// Receives, for one layer, the residual stream entering it (the hidden state before its input
// RMSNorm) for positions [pos0, pos0 + n): x is [n, hidden] f32, valid only during the call.
using ResidualHook = std::function<void(int64_t layer, int64_t pos0, int64_t n, const float* x)>;

struct ForwardOptions {
  bool all_logits = false;        // logits for every new token instead of only the last one
  AttnInputHook attn_input_hook;  // optional calibration capture
  ResidualHook residual_hook;     // optional calibration capture
  // Calibration's shortcut when only layers [first_layer, n_layers) can differ from a pass
  // already run: start at first_layer from first_hidden ([n_tokens, hidden] f32, the residual
  // stream entering first_layer for these tokens, as residual_hook saw it) instead of embedding
  // the tokens. The layers below are not run, and their KV rows for these positions are left
  // as they were. 0 (with first_hidden null) runs every layer.
  int64_t first_layer = 0;
  const float* first_hidden = nullptr;
  // Runs the pass on this backend instead of the model's (null: the model's): calibration's
  // request workers each drive a single-threaded one. It must use the model's activation
  // precision; the CPU backend's results do not depend on its thread count.
  Backend* backend = nullptr;
  // Called on the calling thread after each layer but the last of every micro-batch, outside
  // any parallel region: the engine's chance to run other sessions' work (a hand-over's) in
  // the middle of a long pass. It must not touch this pass's caches.
  std::function<void()> between_layers;
};

struct NllResult {
  std::vector<double> nll;  // per scored token, natural log
  double mean = 0.0;
};

// One session's part of a shared forward pass (Model::ForwardMany): `tokens` at positions
// [cache.n_tokens(), cache.n_tokens() + n); `logits`, when not null, receives the last
// position's logits [vocab], or [n, vocab] when all_logits.
struct ForwardSegment {
  std::span<const int32_t> tokens;
  KvCache* cache = nullptr;
  bool all_logits = false;
  std::vector<float>* logits = nullptr;
};

class ModelFiles;

class Model {
 public:
  // Loads a GGUF file or a Hugging Face directory (config.json, model.safetensors or the shards
  // of model.safetensors.index.json, tokenizer.json). Every tensor's presence, type and shape
  // is checked.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                                     const ModelOptions& options = {});
  ~Model();

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  Backend& backend() { return *backend_; }
  // Bytes of weights as stored (quantized blocks stay quantized).
  int64_t weight_bytes() const { return weight_bytes_; }

  // Layer `layer`'s frozen K and V projections ([kv_width, hidden] as stored) and their biases
  // (empty spans when the architecture has none): what RISK-KV folds its predictors into.
  struct KvProjection {
    WeightMatrix k, v;
    std::span<const float> k_bias, v_bias;
  };
  KvProjection kv_projection(int64_t layer) const;

  // Calls `fn` on every weight tensor in a fixed order: token_embd; per layer attn_norm, wq, wk,
  // wv, [bq, bk, bv,] wo, ffn_norm, w_gate, w_up, w_down; output_norm; lm_head (left out when
  // tied to token_embd). Matrices are passed as stored (dtype and bytes of the file), norms and
  // biases as the f32 copies the forward pass uses. `data` is valid as long as the model.
  using WeightVisitor =
      std::function<void(std::string_view name, DType dtype, const void* data, size_t bytes)>;
  void ForEachWeight(const WeightVisitor& fn) const;

  // A cache sized for this model; capacity is clamped to the context length.
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int64_t capacity,
                                                      DType dtype = DType::kF32) const;

  // Runs `tokens` at positions [cache.n_tokens(), cache.n_tokens() + n), writes their K/V into
  // the cache and advances it. logits receives [1 or n, vocab] f32 (see ForwardOptions).
  absl::Status Forward(std::span<const int32_t> tokens, KvCache& cache,
                       const ForwardOptions& options, std::vector<float>* logits);
  // Several sessions' tokens in shared passes: every weight product runs once over the tokens of
  // all segments (in micro-batches of at most 256 tokens, a segment cut between two of them
  // where it must), RoPE and attention per segment against its own cache. A status per segment:
  // one that fails CheckTokens (or names a cache an earlier segment holds) fails alone and its
  // cache is left as it was. A segment's logits and KV rows are bit for bit those of Forward
  // over it alone. `backend` as ForwardOptions::backend.
  std::vector<absl::Status> ForwardMany(std::span<const ForwardSegment> segments,
                                        Backend* backend = nullptr,
                                        std::function<void()> between_layers = nullptr);
  // Last-position logits after appending the tokens.
  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens, KvCache& cache);
  absl::StatusOr<std::vector<float>> Decode(int32_t token, KvCache& cache);
  // Teacher-forced NLL of `continuation` given the history already in the cache. Token i + 1 is
  // scored from the logits after token i; token 0 is scored from `first_logits` (the logits
  // the history's last position produced) when given, and only conditions otherwise.
  absl::StatusOr<NllResult> TeacherForcedNll(std::span<const int32_t> continuation, KvCache& cache,
                                             std::span<const float> first_logits = {});

 private:
  struct Layer;
  Model();
  absl::Status CheckTokens(std::span<const int32_t> tokens, const KvCache& cache) const;
  // One micro-batch: consecutive tokens of one or more caches. `logits` of a piece, when not
  // null, receives its rows' logits: every row's when all_logits, else the last row's.
  struct Piece {
    std::span<const int32_t> tokens;
    KvCache* cache = nullptr;
    bool all_logits = false;
    float* logits = nullptr;
  };
  // Runs checked segments in micro-batches of at most 256 tokens, filled in segment order (a
  // segment cut between two where it must); options' first_hidden and hooks with one segment
  // only. Sizes each segment's logits.
  void RunSegments(std::span<const ForwardSegment* const> run, const ForwardOptions& options);
  // hidden, when not null, is the batch's residual stream entering options.first_layer (one
  // piece only).
  void ForwardBatch(std::span<const Piece> pieces, const ForwardOptions& options,
                    const float* hidden);

  ModelConfig config_;
  std::unique_ptr<ModelFiles> files_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  WeightMatrix token_embedding_;
  WeightMatrix lm_head_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
  int64_t weight_bytes_ = 0;
  // Regroups w in panels when its type and shape have them: quantized types where `quantized`
  // (8-bit products on a CPU that runs their kernel), F16 and BF16 always.
  void AddPanels(WeightMatrix& w, bool quantized);

  // The packed matrices' panels (WeightMatrix::panels).
  std::vector<cpu::Panels> panels_;
};

// -log softmax(logits)[target] in double: cpu::LogSumExp of the row minus the target's logit.
double TokenNll(std::span<const float> logits, int32_t target);

// The scoring half of a teacher-forced NLL, shared by every engine: runs `continuation` through
// `forward` (which appends a batch to the session and returns every position's logits) in
// batches of at most 256 tokens, and scores each next token; token 0 is scored from
// `first_logits` when given. The caller has checked the tokens against its session; an empty
// continuation or first_logits of the wrong size are refused here. `on_position`, when given,
// sees the logits each scored token i (the index into NllResult::nll) was scored from.
using AllLogitsFn =
    std::function<absl::Status(std::span<const int32_t> batch, std::vector<float>* logits)>;
using PositionFn = std::function<void(int64_t i, std::span<const float> logits)>;
absl::StatusOr<NllResult> ScoreContinuation(std::span<const int32_t> continuation, int64_t vocab,
                                            std::span<const float> first_logits,
                                            const AllLogitsFn& forward,
                                            const PositionFn& on_position = nullptr);

}  // namespace riskkv
