// The Llama/Qwen2 forward pass on a Backend: pre-norm attention and SwiGLU blocks with a
// per-layer KV cache, processed in bounded micro-batches.
#include "common/model/model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_internal.h"
#include "kernels/cpu/fixed_order.h"

namespace riskkv {
namespace {

// Tokens per micro-batch: bounds activation and logits memory for long prompts.
constexpr int64_t kMicroBatch = 256;

}  // namespace

Model::Model() = default;
Model::~Model() = default;

double TokenNll(std::span<const float> logits, int32_t target) {
  return cpu::LogSumExp(logits.data(), static_cast<int64_t>(logits.size())) - logits[target];
}

Model::KvProjection Model::kv_projection(int64_t layer) const {
  const Layer& l = layers_[layer];
  return {l.wk, l.wv, l.bk, l.bv};
}

void Model::ForEachWeight(const WeightVisitor& fn) const {
  auto matrix = [&fn](const std::string& name, const WeightMatrix& w) {
    fn(name, w.dtype, w.data, static_cast<size_t>(w.rows * RowBytes(w.dtype, w.cols)));
  };
  auto vector = [&fn](const std::string& name, const std::vector<float>& v) {
    fn(name, DType::kF32, v.data(), v.size() * sizeof(float));
  };
  matrix("token_embd", token_embedding_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    const std::string p = absl::StrCat("blk.", l, ".");
    vector(p + "attn_norm", w.attn_norm);
    matrix(p + "wq", w.wq);
    matrix(p + "wk", w.wk);
    matrix(p + "wv", w.wv);
    if (!w.bq.empty()) vector(p + "bq", w.bq);
    if (!w.bk.empty()) vector(p + "bk", w.bk);
    if (!w.bv.empty()) vector(p + "bv", w.bv);
    matrix(p + "wo", w.wo);
    vector(p + "ffn_norm", w.ffn_norm);
    matrix(p + "w_gate", w.w_gate);
    matrix(p + "w_up", w.w_up);
    matrix(p + "w_down", w.w_down);
  }
  vector("output_norm", output_norm_);
  if (!config_.tied_embeddings) matrix("lm_head", lm_head_);
}

absl::StatusOr<std::unique_ptr<KvCache>> Model::NewKvCache(int64_t capacity, DType dtype) const {
  return KvCache::Create(config_.n_layers, config_.n_kv_heads, config_.head_dim,
                         std::min(capacity, config_.context_length), dtype);
}

absl::Status Model::CheckTokens(std::span<const int32_t> tokens, const KvCache& cache) const {
  if (cache.n_layers() != config_.n_layers || cache.n_kv_heads() != config_.n_kv_heads ||
      cache.head_dim() != config_.head_dim) {
    return absl::InvalidArgumentError("KV cache shape does not match the model");
  }
  RETURN_IF_ERROR(CheckTokenIds(tokens, config_.vocab));
  const int64_t end = cache.n_tokens() + static_cast<int64_t>(tokens.size());
  if (end > config_.context_length) {
    return absl::OutOfRangeError(
        absl::StrCat(end, " tokens exceed the model's context length of ", config_.context_length));
  }
  if (end > cache.capacity()) {
    return absl::OutOfRangeError(
        absl::StrCat(end, " tokens exceed the KV cache capacity of ", cache.capacity()));
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(std::span<const int32_t> tokens, KvCache& cache,
                            const ForwardOptions& options, std::vector<float>* logits) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  RETURN_IF_ERROR(CheckTokens(tokens, cache));
  if (options.first_layer < 0 || options.first_layer >= config_.n_layers ||
      (options.first_layer > 0) != (options.first_hidden != nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_layer ", options.first_layer, " of ", config_.n_layers,
                     " layers needs first_hidden exactly when it is above 0"));
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (logits != nullptr) logits->assign((options.all_logits ? n : 1) * config_.vocab, 0.0f);
  for (int64_t start = 0; start < n; start += kMicroBatch) {
    const int64_t m = std::min(kMicroBatch, n - start);
    const bool last_batch = start + m == n;
    float* out = nullptr;
    if (logits != nullptr && options.all_logits) out = logits->data() + start * config_.vocab;
    if (logits != nullptr && !options.all_logits && last_batch) out = logits->data();
    const float* hidden =
        options.first_hidden == nullptr ? nullptr : options.first_hidden + start * config_.hidden;
    ForwardBatch(tokens.subspan(start, m), cache, options, hidden, options.all_logits, out);
  }
  return absl::OkStatus();
}

void Model::ForwardBatch(std::span<const int32_t> tokens, KvCache& cache,
                         const ForwardOptions& options, const float* hidden, bool all_logits,
                         float* logits) {
  const ModelConfig& c = config_;
  Backend& be = options.backend != nullptr ? *options.backend : *backend_;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t pos0 = cache.n_tokens();
  const int64_t q_width = c.n_heads * c.head_dim;
  const int64_t kv_width = c.kv_width();

  std::vector<float> x(n * c.hidden), xn(n * c.hidden), q(n * q_width), k(n * kv_width),
      v(n * kv_width), attn(n * q_width), proj(n * c.hidden), gate(n * c.ffn), up(n * c.ffn);
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(pos0 + i);
  const RopeParams rope = c.rope();
  const float eps = static_cast<float>(c.rms_eps);

  if (hidden != nullptr) {
    std::copy(hidden, hidden + n * c.hidden, x.begin());
  } else {
    be.Embed(token_embedding_, tokens.data(), n, x.data());
  }
  for (int64_t l = options.first_layer; l < c.n_layers; ++l) {
    const Layer& w = layers_[l];
    if (options.residual_hook) options.residual_hook(l, pos0, n, x.data());
    be.RmsNorm(x.data(), n, c.hidden, w.attn_norm.data(), eps, xn.data());
    if (options.attn_input_hook) options.attn_input_hook(l, pos0, n, xn.data());
    be.MatMul(xn.data(), n, w.wq, w.bq.empty() ? nullptr : w.bq.data(), q.data());
    be.MatMul(xn.data(), n, w.wk, w.bk.empty() ? nullptr : w.bk.data(), k.data());
    be.MatMul(xn.data(), n, w.wv, w.bv.empty() ? nullptr : w.bv.data(), v.data());
    be.Rope(q.data(), n, c.n_heads, positions.data(), rope, /*inverse=*/false);
    be.Rope(k.data(), n, c.n_kv_heads, positions.data(), rope, /*inverse=*/false);
    // Ranges were validated by CheckTokens, so these writes cannot fail.
    (void)cache.WriteKeys(l, pos0, n, k.data());
    (void)cache.WriteValues(l, pos0, n, v.data());
    be.Attention(q.data(), n, pos0, cache.KeyView(l, n), cache.ValueView(l, n), c.n_heads,
                 c.n_kv_heads, c.head_dim, attn.data());
    be.MatMul(attn.data(), n, w.wo, nullptr, proj.data());
    for (int64_t i = 0; i < n * c.hidden; ++i) x[i] += proj[i];

    be.RmsNorm(x.data(), n, c.hidden, w.ffn_norm.data(), eps, xn.data());
    be.MatMul(xn.data(), n, w.w_gate, nullptr, gate.data());
    be.MatMul(xn.data(), n, w.w_up, nullptr, up.data());
    be.SwiGlu(gate.data(), up.data(), n * c.ffn, gate.data());
    be.MatMul(gate.data(), n, w.w_down, nullptr, proj.data());
    for (int64_t i = 0; i < n * c.hidden; ++i) x[i] += proj[i];
  }
  (void)cache.SetTokens(pos0 + n);
  if (logits == nullptr) return;
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  be.RmsNorm(x.data() + first * c.hidden, rows, c.hidden, output_norm_.data(), eps, xn.data());
  be.MatMul(xn.data(), rows, lm_head_, nullptr, logits);
}

absl::StatusOr<std::vector<float>> Model::Prefill(std::span<const int32_t> tokens, KvCache& cache) {
  std::vector<float> logits;
  RETURN_IF_ERROR(Forward(tokens, cache, {}, &logits));
  return logits;
}

absl::StatusOr<std::vector<float>> Model::Decode(int32_t token, KvCache& cache) {
  return Prefill(std::span<const int32_t>(&token, 1), cache);
}

absl::StatusOr<NllResult> Model::TeacherForcedNll(std::span<const int32_t> continuation,
                                                  KvCache& cache,
                                                  std::span<const float> first_logits) {
  RETURN_IF_ERROR(CheckTokens(continuation, cache));
  ForwardOptions options;
  options.all_logits = true;
  return ScoreContinuation(continuation, config_.vocab, first_logits,
                           [&](std::span<const int32_t> batch, std::vector<float>* logits) {
                             return Forward(batch, cache, options, logits);
                           });
}

absl::StatusOr<NllResult> ScoreContinuation(std::span<const int32_t> continuation, int64_t vocab,
                                            std::span<const float> first_logits,
                                            const AllLogitsFn& forward) {
  if (continuation.empty()) return absl::InvalidArgumentError("empty continuation");
  if (!first_logits.empty() && static_cast<int64_t>(first_logits.size()) != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_logits has ", first_logits.size(), " values, expected ", vocab));
  }
  NllResult result;
  if (!first_logits.empty()) result.nll.push_back(TokenNll(first_logits, continuation[0]));
  // Batch by batch, so logits never exceed kMicroBatch x vocab.
  const int64_t n = static_cast<int64_t>(continuation.size());
  std::vector<float> logits;
  for (int64_t start = 0; start < n; start += kMicroBatch) {
    const int64_t m = std::min(kMicroBatch, n - start);
    RETURN_IF_ERROR(forward(continuation.subspan(start, m), &logits));
    for (int64_t i = 0; i < m && start + i + 1 < n; ++i) {
      result.nll.push_back(TokenNll(std::span<const float>(logits).subspan(i * vocab, vocab),
                                    continuation[start + i + 1]));
    }
  }
  double sum = 0.0;
  for (double v : result.nll) sum += v;
  result.mean = result.nll.empty() ? 0.0 : sum / result.nll.size();
  return result;
}

}  // namespace riskkv
