// The parts of the Engine interface every backend shares (see engine.h).
#include "common/engine/engine.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"

namespace riskkv {
int64_t KvStore::row_bytes() const {
  return engine_->config().kv_width() * (dtype() == DType::kF16 ? 2 : 4);
}

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
                                            bool replay) {
  RETURN_IF_ERROR(CheckOwner(store));
  if (tokens.empty()) return absl::InvalidArgumentError("a session to resume has no tokens");
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
    ASSIGN_OR_RETURN(r.logits, Prefill(tokens.subspan(store.n_tokens()), store));
    r.prefill_seconds = prefill.Seconds();
    return r;
  }
  ASSIGN_OR_RETURN(r.logits, Decode(tokens.back(), store));
  return r;
}

}  // namespace riskkv
