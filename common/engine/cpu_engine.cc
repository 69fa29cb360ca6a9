// The CPU engine (see cpu_engine.h).
#include "common/engine/cpu_engine.h"

#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/rebuild.h"

namespace riskkv {
namespace {

class CpuPredictors final : public EnginePredictors {
 public:
  CpuPredictors(const Engine* engine, std::shared_ptr<const PredictorBank> bank)
      : EnginePredictors(engine, std::move(bank)) {}
};

}  // namespace

absl::Status CpuKvStore::WriteRows(int32_t layer, bool values, int64_t first, int64_t count,
                                   DType rows_dtype, const uint8_t* rows) {
  RETURN_IF_ERROR(CheckRows(layer, first, count));
  if (rows_dtype == cache_->dtype()) {
    uint8_t* dst = values ? cache_->ValueRows(layer, first) : cache_->KeyRows(layer, first);
    std::memcpy(dst, rows, count * cache_->token_bytes());
    return absl::OkStatus();
  }
  const int64_t n = count * cache_->width();
  f32_.resize(n);
  if (rows_dtype == DType::kF16) {
    f16_.resize(n);
    std::memcpy(f16_.data(), rows, n * 2);
    F16ToF32Row(f16_.data(), f32_.data(), n);
  } else if (rows_dtype == DType::kF32) {
    std::memcpy(f32_.data(), rows, n * 4);
  } else {
    return absl::InvalidArgumentError("KV rows must be f32 or f16");
  }
  return values ? cache_->WriteValues(layer, first, count, f32_.data())
                : cache_->WriteKeys(layer, first, count, f32_.data());
}

absl::Status CpuKvStore::FinishLayer(int32_t layer) { return CheckRows(layer, 0, 0); }

absl::Status CpuKvStore::ReadRows(int32_t layer, bool values, int64_t first, int64_t count,
                                  uint8_t* out) const {
  RETURN_IF_ERROR(CheckRows(layer, first, count));
  const uint8_t* src = values ? cache_->ValueRows(layer, first) : cache_->KeyRows(layer, first);
  std::memcpy(out, src, count * cache_->token_bytes());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvStore>> CpuEngine::NewStore(int64_t capacity) {
  const ModelConfig& c = config();
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                   KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim,
                                   std::min(capacity, c.context_length), kv_dtype()));
  return std::make_unique<CpuKvStore>(this, std::move(cache));
}

absl::StatusOr<std::unique_ptr<KvStore>> CpuEngine::CopyStore(const KvStore& from) {
  RETURN_IF_ERROR(CheckOwner(from));
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> copy,
                   static_cast<const CpuKvStore&>(from).cache().Clone());
  return std::make_unique<CpuKvStore>(this, std::move(copy));
}

std::vector<absl::Status> CpuEngine::Step(std::span<const BatchItem> items,
                                          const BetweenLayers& between_layers) {
  std::vector<absl::Status> status(items.size());
  const std::vector<CpuKvStore*> stores = OwnItems<CpuKvStore>(items, &status);
  std::vector<ForwardSegment> segments;
  std::vector<size_t> index;  // item of each segment
  for (size_t i = 0; i < items.size(); ++i) {
    if (stores[i] == nullptr) continue;
    segments.push_back({.tokens = items[i].tokens,
                        .cache = &stores[i]->cache(),
                        .all_logits = items[i].all_logits,
                        .logits = items[i].logits});
    index.push_back(i);
  }
  if (segments.empty()) return status;
  absl::MutexLock lock(&mu_);
  // Between two layers the backend's scratch holds nothing of the step: the hook runs with the
  // lock released, so the work it starts (a hand-over's step or rebuild) can take it.
  std::function<void()> yield;
  if (between_layers) {
    yield = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      mu_.Unlock();
      between_layers();
      mu_.Lock();
    };
  }
  std::vector<absl::Status> ran = model_->ForwardMany(segments, nullptr, std::move(yield));
  for (size_t j = 0; j < ran.size(); ++j) status[index[j]] = std::move(ran[j]);
  return status;
}

absl::StatusOr<std::shared_ptr<const EnginePredictors>> CpuEngine::LoadPredictors(
    std::shared_ptr<const PredictorBank> bank) {
  if (bank == nullptr) return absl::InvalidArgumentError("no predictor bank to load");
  return std::make_shared<const CpuPredictors>(this, std::move(bank));
}

absl::StatusOr<double> CpuEngine::Rebuild(KvStore& store, const EnginePredictors& predictors,
                                          const FoldedGroup& group, int64_t begin, int64_t count) {
  ASSIGN_OR_RETURN(CpuKvStore * s, Own<CpuKvStore>(store));
  RETURN_IF_ERROR(CheckOwner(predictors));
  absl::MutexLock lock(&mu_);
  const Stopwatch rebuild;  // the rebuild, not the wait for the lock
  RETURN_IF_ERROR(
      RebuildGroup(s->cache(), group, model_->config(), model_->backend(), begin, count));
  return rebuild.Seconds();
}

absl::StatusOr<double> CpuEngine::WaitRebuilds(KvStore& store) {
  RETURN_IF_ERROR(CheckOwner(store));
  return 0.0;
}

}  // namespace riskkv
