// The parts of the Engine interface every backend shares (see engine.h).
#include "common/engine/engine.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace riskkv {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

int64_t KvStore::row_bytes() const {
  return engine_->config().kv_width() * (dtype() == DType::kF16 ? 2 : 4);
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
  if (replay && tokens.size() > 1) {
    const auto start = Clock::now();
    ASSIGN_OR_RETURN(std::vector<float> ignored, Prefill(tokens.first(tokens.size() - 1), store));
    r.prefill_seconds = Since(start);
  }
  ASSIGN_OR_RETURN(r.logits, Decode(tokens.back(), store));
  return r;
}

}  // namespace riskkv
