// The Llama/Qwen2 forward pass on a Backend: pre-norm attention and SwiGLU blocks with a
// per-layer KV cache, processed in bounded micro-batches.
#include "common/model/model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
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
  auto matrix = [&](const std::string& name, const WeightMatrix& w) {
    const auto bytes = static_cast<size_t>(w.rows * RowBytes(w.dtype, w.cols));
    fn(name, w.dtype, w.data, bytes);
    // A matrix the products read from panels (the token embedding too, when the LM head is the
    // same bytes) goes back out of the resident set once visited, as it did after packing.
    const bool packed = w.panels != nullptr || (w.data == lm_head_.data && lm_head_.panels);
    if (packed && files_->gguf != nullptr) DropMappedPages(w.data, bytes);
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
  const ForwardSegment segment{
      .tokens = tokens, .cache = &cache, .all_logits = options.all_logits, .logits = logits};
  const ForwardSegment* run = &segment;
  RunSegments(std::span<const ForwardSegment* const>(&run, 1), options);
  return absl::OkStatus();
}

std::vector<absl::Status> Model::ForwardMany(std::span<const ForwardSegment> segments,
                                             Backend* backend,
                                             std::function<void()> between_layers) {
  std::vector<absl::Status> status(segments.size());
  std::vector<const ForwardSegment*> run;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ForwardSegment& seg = segments[i];
    if (seg.cache == nullptr) {
      status[i] = absl::InvalidArgumentError("a segment without a KV cache");
    } else if (seg.tokens.empty()) {
      status[i] = absl::InvalidArgumentError("no tokens to run");
    } else if (std::any_of(run.begin(), run.end(),
                           [&](const ForwardSegment* r) { return r->cache == seg.cache; })) {
      status[i] = absl::InvalidArgumentError("a KV cache appears twice in one pass");
    } else {
      status[i] = CheckTokens(seg.tokens, *seg.cache);
    }
    if (status[i].ok()) run.push_back(&seg);
  }
  ForwardOptions options;
  options.backend = backend;
  options.between_layers = std::move(between_layers);
  RunSegments(run, options);
  return status;
}

void Model::RunSegments(std::span<const ForwardSegment* const> run, const ForwardOptions& options) {
  for (const ForwardSegment* seg : run) {
    if (seg->logits == nullptr) continue;
    const int64_t rows = seg->all_logits ? static_cast<int64_t>(seg->tokens.size()) : 1;
    seg->logits->assign(rows * config_.vocab, 0.0f);
  }
  // Micro-batches of at most kMicroBatch tokens, filled in segment order.
  std::vector<Piece> pieces;
  int64_t filled = 0, done = 0;  // tokens in the micro-batch; in the ones before it
  auto flush = [&] {
    const float* hidden =
        options.first_hidden == nullptr ? nullptr : options.first_hidden + done * config_.hidden;
    ForwardBatch(pieces, options, hidden);
    pieces.clear();
    done += filled;
    filled = 0;
  };
  for (const ForwardSegment* seg : run) {
    const int64_t n = static_cast<int64_t>(seg->tokens.size());
    for (int64_t start = 0; start < n;) {
      const int64_t m = std::min(kMicroBatch - filled, n - start);
      Piece piece{.tokens = seg->tokens.subspan(start, m),
                  .cache = seg->cache,
                  .all_logits = seg->all_logits};
      if (seg->logits != nullptr && seg->all_logits) {
        piece.logits = seg->logits->data() + start * config_.vocab;
      }
      if (seg->logits != nullptr && !seg->all_logits && start + m == n) {
        piece.logits = seg->logits->data();
      }
      pieces.push_back(piece);
      filled += m;
      start += m;
      if (filled == kMicroBatch) flush();
    }
  }
  if (!pieces.empty()) flush();
}

void Model::ForwardBatch(std::span<const Piece> pieces, const ForwardOptions& options,
                         const float* hidden) {
  const ModelConfig& c = config_;
  Backend& be = options.backend != nullptr ? *options.backend : *backend_;
  const int64_t q_width = c.n_heads * c.head_dim;
  const int64_t kv_width = c.kv_width();
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> offset, pos0;  // per piece: its first row in the batch, its first position
  for (const Piece& p : pieces) {
    offset.push_back(static_cast<int64_t>(ids.size()));
    pos0.push_back(p.cache->n_tokens());
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      ids.push_back(p.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos0.back() + static_cast<int64_t>(i)));
    }
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> x(n * c.hidden), xn(n * c.hidden), q(n * q_width), k(n * kv_width),
      v(n * kv_width), attn(n * q_width), proj(n * c.hidden), gate(n * c.ffn), up(n * c.ffn);
  const RopeParams rope = c.rope();
  std::vector<AttentionCall> attention;
  const float eps = static_cast<float>(c.rms_eps);

  if (hidden != nullptr) {
    std::copy(hidden, hidden + n * c.hidden, x.begin());
  } else {
    be.Embed(token_embedding_, ids.data(), n, x.data());
  }
  for (int64_t l = options.first_layer; l < c.n_layers; ++l) {
    const Layer& w = layers_[l];
    if (options.residual_hook) options.residual_hook(l, pos0[0], n, x.data());
    be.RmsNorm(x.data(), n, c.hidden, w.attn_norm.data(), eps, xn.data());
    if (options.attn_input_hook) options.attn_input_hook(l, pos0[0], n, xn.data());
    const MatMulOut qkv[] = {{&w.wq, w.bq.empty() ? nullptr : w.bq.data(), q.data()},
                             {&w.wk, w.bk.empty() ? nullptr : w.bk.data(), k.data()},
                             {&w.wv, w.bv.empty() ? nullptr : w.bv.data(), v.data()}};
    be.MatMulMany(xn.data(), n, qkv);
    be.Rope(q.data(), n, c.n_heads, positions.data(), rope, /*inverse=*/false);
    be.Rope(k.data(), n, c.n_kv_heads, positions.data(), rope, /*inverse=*/false);
    attention.clear();
    for (size_t p = 0; p < pieces.size(); ++p) {
      KvCache& cache = *pieces[p].cache;
      const int64_t m = static_cast<int64_t>(pieces[p].tokens.size());
      const int64_t o = offset[p];
      // Ranges were validated by CheckTokens, so these writes cannot fail.
      (void)cache.WriteKeys(l, pos0[p], m, k.data() + o * kv_width);
      (void)cache.WriteValues(l, pos0[p], m, v.data() + o * kv_width);
      attention.push_back({q.data() + o * q_width, m, pos0[p], cache.KeyView(l, m),
                           cache.ValueView(l, m), attn.data() + o * q_width});
    }
    be.AttentionMany(attention, c.n_heads, c.n_kv_heads, c.head_dim);
    be.MatMul(attn.data(), n, w.wo, nullptr, proj.data());
    for (int64_t i = 0; i < n * c.hidden; ++i) x[i] += proj[i];

    be.RmsNorm(x.data(), n, c.hidden, w.ffn_norm.data(), eps, xn.data());
    const MatMulOut gate_up[] = {{&w.w_gate, nullptr, gate.data()}, {&w.w_up, nullptr, up.data()}};
    be.MatMulMany(xn.data(), n, gate_up);
    be.SwiGlu(gate.data(), up.data(), n * c.ffn, gate.data());
    be.MatMul(gate.data(), n, w.w_down, nullptr, proj.data());
    for (int64_t i = 0; i < n * c.hidden; ++i) x[i] += proj[i];
    if (options.between_layers && l + 1 < c.n_layers) options.between_layers();
  }
  for (size_t p = 0; p < pieces.size(); ++p) {
    (void)pieces[p].cache->SetTokens(pos0[p] + static_cast<int64_t>(pieces[p].tokens.size()));
  }
  // The rows whose logits are wanted: a piece's every row, or its last.
  struct Rows {
    int64_t first, count;
    float* out;
  };
  std::vector<Rows> wanted;
  int64_t total = 0;
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (pieces[p].logits == nullptr) continue;
    const int64_t m = static_cast<int64_t>(pieces[p].tokens.size());
    const int64_t first = pieces[p].all_logits ? 0 : m - 1;
    wanted.push_back({offset[p] + first, m - first, pieces[p].logits});
    total += m - first;
  }
  if (wanted.empty()) return;
  if (wanted.size() == 1) {
    // Straight into the caller's logits (a scoring batch's are 256 x vocab).
    be.RmsNorm(x.data() + wanted[0].first * c.hidden, wanted[0].count, c.hidden,
               output_norm_.data(), eps, xn.data());
    be.MatMul(xn.data(), wanted[0].count, lm_head_, nullptr, wanted[0].out);
    return;
  }
  int64_t row = 0;
  for (const Rows& r : wanted) {
    std::copy(x.data() + r.first * c.hidden, x.data() + (r.first + r.count) * c.hidden,
              proj.data() + row * c.hidden);
    row += r.count;
  }
  be.RmsNorm(proj.data(), total, c.hidden, output_norm_.data(), eps, xn.data());
  std::vector<float> out(total * c.vocab);
  be.MatMul(xn.data(), total, lm_head_, nullptr, out.data());
  row = 0;
  for (const Rows& r : wanted) {
    std::copy(out.data() + row * c.vocab, out.data() + (row + r.count) * c.vocab, r.out);
    row += r.count;
  }
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
                                            const AllLogitsFn& forward,
                                            const PositionFn& on_position) {
  if (continuation.empty()) return absl::InvalidArgumentError("empty continuation");
  if (!first_logits.empty() && static_cast<int64_t>(first_logits.size()) != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("first_logits has ", first_logits.size(), " values, expected ", vocab));
  }
  NllResult result;
  if (!first_logits.empty()) {
    if (on_position) on_position(0, first_logits);
    result.nll.push_back(TokenNll(first_logits, continuation[0]));
  }
  // Batch by batch, so logits never exceed kMicroBatch x vocab.
  const int64_t n = static_cast<int64_t>(continuation.size());
  std::vector<float> logits;
  for (int64_t start = 0; start < n; start += kMicroBatch) {
    const int64_t m = std::min(kMicroBatch, n - start);
    RETURN_IF_ERROR(forward(continuation.subspan(start, m), &logits));
    for (int64_t i = 0; i < m && start + i + 1 < n; ++i) {
      const auto row = std::span<const float>(logits).subspan(i * vocab, vocab);
      if (on_position) on_position(static_cast<int64_t>(result.nll.size()), row);
      result.nll.push_back(TokenNll(row, continuation[start + i + 1]));
    }
  }
  double sum = 0.0;
  for (double v : result.nll) sum += v;
  result.mean = result.nll.empty() ? 0.0 : sum / result.nll.size();
  return result;
}

}  // namespace riskkv
