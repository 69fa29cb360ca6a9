// The CPU engine: sessions in host KvCaches, forward passes and rebuilds on the model's CPU
// backend (the oracle every other engine is checked against).
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"

namespace riskkv {

// A session's KV in host memory; cache() gives the engine's own view of it.
class CpuKvStore final : public KvStore {
 public:
  CpuKvStore(const Engine* engine, std::unique_ptr<KvCache> cache)
      : KvStore(engine), cache_(std::move(cache)) {}

  int64_t n_tokens() const override { return cache_->n_tokens(); }
  int64_t capacity() const override { return cache_->capacity(); }
  DType dtype() const override { return cache_->dtype(); }
  absl::Status SetTokens(int64_t n) override { return cache_->SetTokens(n); }
  absl::Status WriteRows(int32_t layer, bool values, int64_t first, int64_t count, DType rows_dtype,
                         const uint8_t* rows) override;
  absl::Status FinishLayer(int32_t layer) override;
  absl::Status ReadRows(int32_t layer, bool values, int64_t first, int64_t count,
                        uint8_t* out) const override;
  absl::Status PrepareRead(int64_t count) const override { return CheckRows(0, 0, count); }

  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }

 private:
  std::unique_ptr<KvCache> cache_;
  std::vector<uint16_t> f16_;  // rows on their way between dtypes
  std::vector<float> f32_;
};

class CpuEngine final : public Engine {
 public:
  // Sessions store KV rows in `kv_dtype` (kF32 or kF16).
  CpuEngine(Model& model, DType kv_dtype) : Engine(model, kv_dtype), model_(&model) {}

  std::string_view backend() const override { return "cpu"; }
  std::string Describe() const override { return "cpu"; }
  absl::StatusOr<std::unique_ptr<KvStore>> NewStore(int64_t capacity) override;
  absl::StatusOr<std::unique_ptr<KvStore>> CopyStore(const KvStore& from) override;
  using Engine::Step;
  std::vector<absl::Status> Step(std::span<const BatchItem> items,
                                 const BetweenLayers& between_layers) override;
  absl::StatusOr<std::shared_ptr<const EnginePredictors>> LoadPredictors(
      std::shared_ptr<const PredictorBank> bank) override;
  absl::StatusOr<double> Rebuild(KvStore& store, const EnginePredictors& predictors,
                                 const FoldedGroup& group, int64_t begin, int64_t count) override;

 protected:
  absl::StatusOr<double> WaitRebuilds(KvStore& store) override;

 private:
  // One step or rebuild at a time: the backend's scratch is shared.
  absl::Mutex mu_;
  Model* const model_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace riskkv
