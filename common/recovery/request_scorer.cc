// Starting each configuration's pass at its lowest changed layer.
#include "common/recovery/request_scorer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>

#include "common/base/status_macros.h"
#include "common/model/sampler.h"
#include "common/model/top_logprobs.h"
#include "common/recovery/parallel_for.h"
#include "kernels/cpu/fixed_order.h"

namespace riskkv {

absl::StatusOr<std::unique_ptr<RequestScorer>> RequestScorer::Create(Model& model,
                                                                     const Request& request,
                                                                     Backend* backend) {
  std::unique_ptr<RequestScorer> s(new RequestScorer(model, request, backend));
  const ModelConfig& c = model.config();
  const auto size = static_cast<int64_t>(request.tokens.size());
  s->scored_ = size - request.moved_rows();
  ASSIGN_OR_RETURN(s->exact_, model.NewKvCache(size));
  if (request.moved_rows() > 0) {
    ForwardOptions options;
    options.backend = backend;
    RETURN_IF_ERROR(
        model.Forward(std::span<const int32_t>(request.tokens).first(request.moved_rows()),
                      *s->exact_, options, nullptr));
  }
  ASSIGN_OR_RETURN(s->work_, s->exact_->Clone());
  ASSIGN_OR_RETURN(s->previous_, s->exact_->Clone());
  s->exact_stream_.resize(c.n_layers * s->scored_ * c.hidden);
  s->previous_stream_.resize(s->exact_stream_.size());
  return s;
}

absl::StatusOr<KvCache*> RequestScorer::NextConfiguration() {
  RETURN_IF_ERROR(work_->CopyFrom(*exact_));
  pending_ = true;
  return work_.get();
}

absl::StatusOr<double> RequestScorer::Score() {
  ASSIGN_OR_RETURN(const ScoredQuality q, ScoreAny(/*divergence=*/false));
  return q.nll;
}

absl::StatusOr<ScoredQuality> RequestScorer::ScoreQuality() {
  return ScoreAny(/*divergence=*/true);
}

absl::StatusOr<ScoredQuality> RequestScorer::ScoreAny(bool divergence) {
  if (!pending_) return absl::FailedPreconditionError("Score() without NextConfiguration()");
  pending_ = false;
  if (work_->n_tokens() != exact_->n_tokens()) {
    return absl::InvalidArgumentError("a configuration changed the number of moved rows");
  }
  const int64_t n_layers = model_.config().n_layers;
  const int64_t from_exact = FirstDifference(*exact_, *work_);
  if (from_exact == n_layers) {
    // The NLL alone costs what it did before divergences; the reference's top tokens are kept
    // only when a divergence is asked for (a second exact pass if the first was NLL only).
    if (!exact_scored_ || (divergence && reference_ids_.empty())) {
      ASSIGN_OR_RETURN(exact_quality_, Run(*work_, 0, exact_stream_, /*reference=*/divergence));
      exact_scored_ = true;
    }
    has_previous_ = previous_is_exact_ = true;
    return exact_quality_;
  }
  if (divergence && reference_ids_.empty()) {
    return absl::FailedPreconditionError(
        "a configuration's divergence needs the exact configuration scored first, by "
        "ScoreQuality");
  }
  // The saved stream to start from, and the layer: the base agreeing on the most layers.
  int64_t first = 0;
  const std::vector<float>* base = nullptr;
  if (exact_scored_) {
    first = from_exact;
    base = &exact_stream_;
  }
  if (has_previous_ && !previous_is_exact_) {
    const int64_t from_previous = FirstDifference(*previous_, *work_);
    // A repeat of the previous configuration costs nothing. (A previous configuration here ran
    // after the exact one whenever the divergence is asked for: it is only kept while no exact
    // configuration has been scored since, and the divergence needs one scored.)
    if (from_previous == n_layers) return previous_quality_;
    if (from_previous > first) {
      first = from_previous;
      base = &previous_stream_;
    }
  }
  if (base == &exact_stream_) {
    // Below `first` the exact stream holds this configuration's inputs.
    const size_t layer_floats = static_cast<size_t>(scored_ * model_.config().hidden);
    std::copy(exact_stream_.begin(), exact_stream_.begin() + (first + 1) * layer_floats,
              previous_stream_.begin());
  }
  ASSIGN_OR_RETURN(previous_quality_, Run(*work_, first, previous_stream_, /*reference=*/false));
  std::swap(work_, previous_);
  has_previous_ = true;
  previous_is_exact_ = false;
  return previous_quality_;
}

void RequestScorer::ScorePosition(std::span<const float> logits, int32_t target, int64_t i,
                                  bool reference, double* nll, double* kl, double* top1) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  const double lse = cpu::LogSumExp(logits.data(), vocab);
  *nll = lse - logits[target];
  const int64_t k = std::min(kKlTopTokens, vocab);
  int32_t* ids = reference_ids_.data() + i * k;
  float* logp = reference_logp_.data() + i * k;
  if (reference) {
    TopLogProbs(logits, k, ids, logp, lse);
    *kl = 0.0;
    *top1 = 1.0;
    return;
  }
  if (reference_ids_.empty()) {  // no reference yet: the NLL only
    *kl = 0.0;
    *top1 = 0.0;
    return;
  }
  // The greedy sampler's token.
  *top1 = TopAgrees(std::span<const int32_t>(ids, k), logits) ? 1.0 : 0.0;
  *kl = TopKl(std::span<const int32_t>(ids, k), std::span<const float>(logp, k), logits, lse);
}

absl::StatusOr<ScoredQuality> RequestScorer::Run(KvCache& cache, int64_t first,
                                                 std::vector<float>& stream, bool reference) {
  const ModelConfig& c = model_.config();
  const int64_t moved = request_.moved_rows();
  const auto tokens = std::span<const int32_t>(request_.tokens);
  auto at = [&](int64_t layer, int64_t pos) {
    return stream.data() + (layer * scored_ + (pos - moved)) * c.hidden;
  };
  ForwardOptions options;
  options.backend = backend_;
  options.first_layer = first;
  options.residual_hook = [&](int64_t layer, int64_t pos0, int64_t n, const float* x) {
    std::copy(x, x + n * c.hidden, at(layer, pos0));
  };
  // What a migration target does next: decode the last history token over the moved (and
  // rebuilt) rows; its logits score the first eval token.
  if (first > 0) options.first_hidden = at(first, moved);
  std::vector<float> last;
  RETURN_IF_ERROR(model_.Forward(tokens.subspan(moved, 1), cache, options, &last));
  options.all_logits = true;
  // The teacher-forced NLL of the eval tokens as ScoreContinuation computes it (token 0 from
  // the decode's logits, token i + 1 from the logits after token i, the mean summed in order),
  // with each block's rows scored on the backend's threads.
  const auto eval = tokens.subspan(request_.history);
  const auto n = static_cast<int64_t>(eval.size());
  if (reference) {
    const auto k = static_cast<size_t>(n * std::min(kKlTopTokens, c.vocab));
    reference_ids_.assign(k, 0);
    reference_logp_.assign(k, 0.0f);
  }
  std::vector<double> nll(n), kl(n), top1(n);
  ScorePosition(last, eval[0], 0, reference, &nll[0], &kl[0], &top1[0]);
  std::vector<float> logits;
  constexpr int64_t kBlock = 256;  // bounds the logits to kBlock x vocab
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    if (first > 0) options.first_hidden = at(first, request_.history + start);
    RETURN_IF_ERROR(model_.Forward(eval.subspan(start, m), cache, options, &logits));
    const int64_t rows = std::min(m, n - 1 - start);
    ParallelChunks(rows, backend().threads(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t at = start + i + 1;
        ScorePosition(std::span<const float>(logits).subspan(i * c.vocab, c.vocab), eval[at], at,
                      reference, &nll[at], &kl[at], &top1[at]);
      }
    });
  }
  ScoredQuality q{.nll = 0.0, .kl = 0.0, .top1 = 0.0};
  for (int64_t i = 0; i < n; ++i) {
    q.nll += nll[i];
    q.kl += kl[i];
    q.top1 += top1[i];
  }
  layers_run_ += c.n_layers - first;
  q.nll /= static_cast<double>(n);
  q.kl /= static_cast<double>(n);
  q.top1 /= static_cast<double>(n);
  return q;
}

int64_t RequestScorer::FirstDifference(const KvCache& a, const KvCache& b) const {
  const size_t bytes = static_cast<size_t>(request_.moved_rows() * a.token_bytes());
  for (int64_t l = 0; l < a.n_layers(); ++l) {
    if (std::memcmp(a.KeyRows(l, 0), b.KeyRows(l, 0), bytes) != 0 ||
        std::memcmp(a.ValueRows(l, 0), b.ValueRows(l, 0), bytes) != 0) {
      return l;
    }
  }
  return a.n_layers();
}

}  // namespace riskkv
