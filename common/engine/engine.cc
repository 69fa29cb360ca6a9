// The parts of the Engine interface every backend shares (see engine.h).
#include "common/engine/engine.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"

namespace riskkv {
int64_t KvStore::row_bytes() const { return RowBytes(dtype(), engine_->config().kv_width()); }

absl::Status KvStore::CheckRows(int32_t layer, int64_t first, int64_t count) const {
  if (layer < 0 || layer >= engine_->config().n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " outside the KV store"));
  }
  if (first < 0 || count < 0 || first > capacity() - count) {
    return absl::InvalidArgumentError(absl::StrCat("rows [", first, ", ", first + count,
                                                   ") outside the KV store's ", capacity()));
  }
  return absl::OkStatus();
}

int64_t Engine::kv_bytes_per_token() const {
  return config().n_layers * 2 * RowBytes(kv_dtype_, config().kv_width());
}

absl::StatusOr<std::vector<float>> Engine::Prefill(std::span<const int32_t> tokens,
                                                   KvStore& store) {
  std::vector<float> logits;
  const BatchItem item{.store = &store, .tokens = tokens, .logits = &logits};
  RETURN_IF_ERROR(Step(std::span<const BatchItem>(&item, 1)).front());
  return logits;
}

absl::StatusOr<NllResult> Engine::Score(std::span<const int32_t> continuation, KvStore& store,
                                        std::span<const float> first_logits) {
  RETURN_IF_ERROR(CheckOwner(store));
  RETURN_IF_ERROR(CheckTokenIds(continuation));
  const int64_t end = store.n_tokens() + static_cast<int64_t>(continuation.size());
  if (end > store.capacity()) {
    return absl::OutOfRangeError(
        absl::StrCat(end, " tokens exceed the KV store's capacity of ", store.capacity()));
  }
  return ScoreContinuation(
      continuation, config().vocab, first_logits,
      [&](std::span<const int32_t> batch, std::vector<float>* logits) {
        const BatchItem item{
            .store = &store, .tokens = batch, .all_logits = true, .logits = logits};
        return Step(std::span<const BatchItem>(&item, 1)).front();
      });
}

absl::Status Engine::CheckTokenIds(std::span<const int32_t> tokens) const {
  return riskkv::CheckTokenIds(tokens, config().vocab);
}

absl::Status Engine::CheckOwner(const KvStore& store) const {
  if (&store.engine() != this) {
    return absl::InvalidArgumentError("a KV store made by another engine");
  }
  return absl::OkStatus();
}

absl::Status Engine::CheckOwner(const EnginePredictors& predictors) const {
  if (&predictors.engine() != this) {
    return absl::InvalidArgumentError("predictors prepared for another engine");
  }
  return absl::OkStatus();
}

absl::StatusOr<ResumeResult> Engine::Resume(KvStore& store, std::span<const int32_t> tokens,
                                            bool replay, const PrefillFn& prefill) {
  RETURN_IF_ERROR(CheckOwner(store));
  if (tokens.empty()) return absl::InvalidArgumentError("a session to resume has no tokens");
  const PrefillFn run =
      prefill ? prefill : [this](std::span<const int32_t> t, KvStore& s) { return Prefill(t, s); };
  ResumeResult r;
  ASSIGN_OR_RETURN(r.rebuild_seconds, WaitRebuilds(store));
  const auto history = static_cast<int64_t>(tokens.size()) - 1;
  if (replay && store.n_tokens() > history) {
    return absl::InvalidArgumentError(
        absl::StrCat("the store holds ", store.n_tokens(), " rows for a history of ", history));
  }
  if (replay && store.n_tokens() < history) {
    // The history's last tokens and the session's last one in one batch: on the CPU the same
    // bits as a prefill of the history and then a decode step (the engine is batch-invariant),
    // in less time than the two, and this is time the session waits for.
    const Stopwatch prefill;
    ASSIGN_OR_RETURN(r.logits, run(tokens.subspan(store.n_tokens()), store));
    r.prefill_seconds = prefill.Seconds();
    return r;
  }
  ASSIGN_OR_RETURN(r.logits, run(tokens.last(1), store));
  return r;
}

}  // namespace riskkv
