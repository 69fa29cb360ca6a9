// The compute engine a node serves with: one interface that the CPU model (the oracle) and the
// GPU model implement, so services hold one engine and one kind of session store whatever runs
// underneath. An engine runs one step (a shared forward pass of several sessions) or rebuild at
// a time (the backends' scratch is shared); every method may be called from any thread. A node
// reaches it through its Scheduler (common/engine/scheduler.h), which forms the steps.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/dtype.h"

namespace riskkv {

class Engine;
class PredictorBank;
struct FoldedGroup;

// One decoding session's KV cache, held by the engine that made it. Per layer, keys (after RoPE,
// in the model's RoPE layout) and values are [capacity, n_kv_heads, head_dim] rows in dtype();
// positions [0, n_tokens()) are valid. Not thread-safe: one call uses a store at a time.
class KvStore {
 public:
  virtual ~KvStore() = default;
  const Engine& engine() const { return *engine_; }

  virtual int64_t n_tokens() const = 0;
  virtual int64_t capacity() const = 0;
  // The dtype of rows read out: the engine's kv_dtype().
  virtual DType dtype() const = 0;
  // Bytes of one token's K (or V) in one layer, in dtype().
  int64_t row_bytes() const;
  // Marks positions [0, n) valid (n <= capacity); shrinking discards the tail.
  virtual absl::Status SetTokens(int64_t n) = 0;

  // Writes rows [first, first + count) of a layer's keys (values: false) or values from `rows`,
  // [count, n_kv_heads, head_dim] in `rows_dtype` (kF32 or kF16, converted to the store's).
  // `rows` may be reused when this returns. InvalidArgument for a layer or range outside the
  // store or an unsupported dtype.
  virtual absl::Status WriteRows(int32_t layer, bool values, int64_t first, int64_t count,
                                 DType rows_dtype, const uint8_t* rows) = 0;
  // Every row of `layer` that will be written has been: a rebuild reading it may run.
  virtual absl::Status FinishLayer(int32_t layer) = 0;
  // Copies rows [first, first + count) of a layer's keys or values into `out`
  // (count * row_bytes() bytes, in dtype()).
  virtual absl::Status ReadRows(int32_t layer, bool values, int64_t first, int64_t count,
                                uint8_t* out) const = 0;
  // Makes rows [0, count) of every layer readable from host memory in one go, so the ReadRows
  // that follow are plain copies until the store changes (a GPU downloads them here, before a
  // migration's stream opens; the CPU has nothing to do).
  virtual absl::Status PrepareRead(int64_t count) const = 0;

 protected:
  explicit KvStore(const Engine* engine) : engine_(engine) {}
  // InvalidArgument for a layer outside the model or rows outside [0, capacity()).
  absl::Status CheckRows(int32_t layer, int64_t first, int64_t count) const;

 private:
  const Engine* engine_;
};

// A predictor bank prepared for one engine (the GPU holds its maps on the device).
class EnginePredictors {
 public:
  virtual ~EnginePredictors() = default;
  const PredictorBank& bank() const { return *bank_; }
  const Engine& engine() const { return *engine_; }

 protected:
  EnginePredictors(const Engine* engine, std::shared_ptr<const PredictorBank> bank)
      : engine_(engine), bank_(std::move(bank)) {}

 private:
  const Engine* engine_;
  std::shared_ptr<const PredictorBank> bank_;
};

// One session's share of a step: `tokens` run at positions [n_tokens, n_tokens + n) of `store`,
// appending their K/V; `logits`, when not null, receives the last position's logits [vocab], or
// every position's [n, vocab] when `all_logits` (scoring).
struct BatchItem {
  KvStore* store = nullptr;
  std::span<const int32_t> tokens;
  bool all_logits = false;
  std::vector<float>* logits = nullptr;
};

// What resuming a received session gave: the next token's logits and where the time went.
struct ResumeResult {
  std::vector<float> logits;     // [vocab], after feeding the session's last token
  double prefill_seconds = 0.0;  // replaying the history (TOKEN_REPLAY)
  double rebuild_seconds = 0.0;  // rebuilds still running when the resume began (GPU)
};

class Engine {
 public:
  virtual ~Engine() = default;

  // "cpu" or "cuda".
  virtual std::string_view backend() const = 0;
  // A line for the start-up log: the backend and, on a GPU, the device and its weight bytes.
  virtual std::string Describe() const = 0;
  const ModelConfig& config() const { return model_.config(); }
  const Tokenizer& tokenizer() const { return model_.tokenizer(); }
  // How sessions store KV rows (kF32 or kF16; the GPU stores kF16), fixed for the engine's life.
  DType kv_dtype() const { return kv_dtype_; }
  // Bytes of one token's K and V rows in every layer, in kv_dtype().
  int64_t kv_bytes_per_token() const;

  // Token ids in the vocabulary, checked once for every caller: InvalidArgument naming the first
  // id outside [0, vocab) and its index.
  absl::Status CheckTokenIds(std::span<const int32_t> tokens) const;

  // A store with room for `capacity` rows in kv_dtype(), clamped to the context length.
  // ResourceExhausted when it cannot be allocated.
  virtual absl::StatusOr<std::unique_ptr<KvStore>> NewStore(int64_t capacity) = 0;
  // A copy of `from` (same capacity, dtype, rows and token count) on this engine.
  virtual absl::StatusOr<std::unique_ptr<KvStore>> CopyStore(const KvStore& from) = 0;

  // Advances every item in shared forward passes (the weight products run once over all the
  // items' tokens, attention per session) and returns a status per item. An item that fails
  // its checks (a store of another engine or one already in this step, token ids outside the
  // vocabulary, rows past the store's capacity or the context, no tokens) fails alone and
  // leaves its store as it was; the others run. On the CPU each item's logits and KV rows are
  // bit for bit those of running it alone, in any batch and at any thread count; the GPU's
  // cuBLAS products may pick other kernels for other row counts (docs/gpu.md).
  //
  // `between_layers`, when set, is called on the calling thread between two layers of the
  // step's pass (the CPU engine; the GPU engine never calls it), with the engine free for other
  // calls on sessions not in the step: the scheduler runs a hand-over's work there rather than
  // after the whole step.
  using BetweenLayers = std::function<void()>;
  virtual std::vector<absl::Status> Step(std::span<const BatchItem> items,
                                         const BetweenLayers& between_layers) = 0;
  std::vector<absl::Status> Step(std::span<const BatchItem> items) { return Step(items, nullptr); }

  // Step with one item: runs `tokens` after the store's rows and returns the last position's
  // logits [vocab].
  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens, KvStore& store);
  absl::StatusOr<std::vector<float>> Decode(int32_t token, KvStore& store) {
    return Prefill(std::span<const int32_t>(&token, 1), store);
  }
  // Teacher-forced NLL of `continuation` after the store's history (appended to the store);
  // token 0 is scored from `first_logits`, the logits of the history's last position.
  absl::StatusOr<NllResult> Score(std::span<const int32_t> continuation, KvStore& store,
                                  std::span<const float> first_logits);

  // RISK-KV reconstruction. A bank prepared for this engine, once per bank.
  virtual absl::StatusOr<std::shared_ptr<const EnginePredictors>> LoadPredictors(
      std::shared_ptr<const PredictorBank> bank) = 0;
  // Rebuilds every target layer of `group` (one of the bank's groups) for rows
  // [begin, begin + count) from its anchors' rows (each finished with FinishLayer). The GPU
  // queues the work behind the anchors' uploads; Resume waits for it. Returns the seconds this
  // call spent (not counting the wait for the engine).
  virtual absl::StatusOr<double> Rebuild(KvStore& store, const EnginePredictors& predictors,
                                         const FoldedGroup& group, int64_t begin,
                                         int64_t count) = 0;

  // The engine's work of resuming a received session, in one call: waits for the rebuilds still
  // queued, runs the history (every token but the last) past the rows the store holds when
  // `replay` (TOKEN_REPLAY: none, or those a live migration prefilled), then feeds the last
  // token. The store then holds a row for every token.
  // `prefill` runs the replay and the last token (null: this engine's Prefill; a node passes its
  // scheduler's, at a hand-over's priority).
  using PrefillFn = std::function<absl::StatusOr<std::vector<float>>(
      std::span<const int32_t> tokens, KvStore& store)>;
  absl::StatusOr<ResumeResult> Resume(KvStore& store, std::span<const int32_t> tokens, bool replay,
                                      const PrefillFn& prefill = nullptr);

 protected:
  Engine(const Model& model, DType kv_dtype) : model_(model), kv_dtype_(kv_dtype) {}
  // Waits for the rebuilds queued on `store` and returns the seconds that took; the CPU
  // rebuilds synchronously and returns 0.
  virtual absl::StatusOr<double> WaitRebuilds(KvStore& store) = 0;
  // InvalidArgument unless `store` (or `predictors`) was made by this engine.
  absl::Status CheckOwner(const KvStore& store) const;
  absl::Status CheckOwner(const EnginePredictors& predictors) const;
  // `store` as the engine's own kind, or InvalidArgument (CheckOwner).
  template <typename Store>
  absl::StatusOr<Store*> Own(KvStore& store) const {
    if (absl::Status owned = CheckOwner(store); !owned.ok()) return owned;
    return static_cast<Store*>(&store);
  }
  // A step's stores as the engine's own kind, in item order: null, with the item's (*status)
  // set, for an item without a store or with another engine's.
  template <typename Store>
  std::vector<Store*> OwnItems(std::span<const BatchItem> items,
                               std::vector<absl::Status>* status) const {
    std::vector<Store*> stores(items.size(), nullptr);
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].store == nullptr) {
        (*status)[i] = absl::InvalidArgumentError("a batch item without a KV store");
        continue;
      }
      absl::StatusOr<Store*> s = Own<Store>(*items[i].store);
      if (s.ok()) {
        stores[i] = *s;
      } else {
        (*status)[i] = s.status();
      }
    }
    return stores;
  }

 private:
  const Model& model_;
  const DType kv_dtype_;
};

struct EngineOptions {
  // "auto" (the GPU when one is usable and kv_dtype is f16, the CPU otherwise), "cpu" or "cuda"
  // (Unavailable without a usable GPU).
  std::string backend = "cpu";
  int gpu_device = 0;
  // How sessions store KV rows: kF32 or kF16 on the CPU; the GPU needs kF16 ("cuda" with kF32
  // is InvalidArgument).
  DType kv_dtype = DType::kF32;
};

// The engine `options` select for `model` (which must outlive it). *note says what was chosen
// and, when "auto" fell back to the CPU, why.
absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(Model& model, const EngineOptions& options,
                                                     std::string* note = nullptr);

}  // namespace riskkv
