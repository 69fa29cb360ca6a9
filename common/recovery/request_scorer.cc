// Starting each configuration's pass at its lowest changed layer.
#include "common/recovery/request_scorer.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "common/base/status_macros.h"
#include "common/recovery/parallel_for.h"

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
  if (!pending_) return absl::FailedPreconditionError("Score() without NextConfiguration()");
  pending_ = false;
  if (work_->n_tokens() != exact_->n_tokens()) {
    return absl::InvalidArgumentError("a configuration changed the number of moved rows");
  }
  const int64_t n_layers = model_.config().n_layers;
  const int64_t from_exact = FirstDifference(*exact_, *work_);
  if (from_exact == n_layers) {
    if (!exact_scored_) {
      ASSIGN_OR_RETURN(exact_nll_, Run(*work_, 0, exact_stream_));
      exact_scored_ = true;
    }
    has_previous_ = previous_is_exact_ = true;
    return exact_nll_;
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
    if (from_previous == n_layers) return previous_nll_;
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
  ASSIGN_OR_RETURN(previous_nll_, Run(*work_, first, previous_stream_));
  std::swap(work_, previous_);
  has_previous_ = true;
  previous_is_exact_ = false;
  return previous_nll_;
}

absl::StatusOr<double> RequestScorer::Run(KvCache& cache, int64_t first,
                                          std::vector<float>& stream) {
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
  std::vector<double> nll(n);
  nll[0] = TokenNll(last, eval[0]);
  std::vector<float> logits;
  constexpr int64_t kBlock = 256;  // bounds the logits to kBlock x vocab
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    if (first > 0) options.first_hidden = at(first, request_.history + start);
    RETURN_IF_ERROR(model_.Forward(eval.subspan(start, m), cache, options, &logits));
    const int64_t rows = std::min(m, n - 1 - start);
    ParallelChunks(rows, backend().threads(), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        nll[start + i + 1] = TokenNll(std::span<const float>(logits).subspan(i * c.vocab, c.vocab),
                                      eval[start + i + 1]);
      }
    });
  }
  double sum = 0.0;
  for (double v : nll) sum += v;
  layers_run_ += c.n_layers - first;
  return sum / static_cast<double>(n);
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
