// The GPU engine: sessions whose f16 KV lives on the device, forward passes and rebuilds through
// the CUDA module (common/model/gpu_model.h); tokenization stays with the CPU model.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/model/gpu_model.h"
#include "common/model/kv_cache.h"

namespace riskkv {

class GpuKvStore final : public KvStore {
 public:
  GpuKvStore(const Engine* engine, std::unique_ptr<GpuSession> session)
      : KvStore(engine), session_(std::move(session)) {}

  int64_t n_tokens() const override { return session_->n_tokens(); }
  int64_t capacity() const override { return session_->capacity(); }
  DType dtype() const override { return DType::kF16; }
  absl::Status SetTokens(int64_t n) override {
    host_.reset();
    return session_->SetTokens(n);
  }
  // Rows are queued for upload on the session's transfer stream; f32 rows are converted first.
  absl::Status WriteRows(int32_t layer, bool values, int64_t first, int64_t count, DType rows_dtype,
                         const uint8_t* rows) override;
  absl::Status FinishLayer(int32_t layer) override;
  // From the host copy PrepareRead made when it covers the rows, from the device otherwise.
  absl::Status ReadRows(int32_t layer, bool values, int64_t first, int64_t count,
                        uint8_t* out) const override;
  // Downloads rows [0, count) of every layer into a host copy, kept until the session changes.
  absl::Status PrepareRead(int64_t count) const override;

  // The device session, for the engine's work on it; the host copy is dropped, since that work
  // may change the rows.
  GpuSession& session() {
    host_.reset();
    return *session_;
  }

 private:
  std::unique_ptr<GpuSession> session_;
  // Rows [0, host_->n_tokens()) as PrepareRead found them: a cache of the device rows.
  mutable std::unique_ptr<KvCache> host_;
  std::vector<float> f32_;  // an f32 chunk, aligned, on its way to f16
  std::vector<uint16_t> f16_;
};

class GpuEngine final : public Engine {
 public:
  // `gpu` holds `model`'s weights on the device; `model` must outlive the engine.
  GpuEngine(const Model& model, std::unique_ptr<GpuModel> gpu, std::string description)
      : Engine(model, DType::kF16),
        owned_(std::move(gpu)),
        gpu_(owned_.get()),
        description_(std::move(description)) {}

  std::string_view backend() const override { return "cuda"; }
  std::string Describe() const override { return description_; }
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
  // One forward pass or rebuild queued at a time, as on the CPU. Allocating sessions and
  // uploading a bank need no such turn: the CUDA module orders them against compute itself.
  absl::Mutex mu_;
  const std::unique_ptr<GpuModel> owned_;
  GpuModel* const gpu_;
  const std::string description_;
};

}  // namespace riskkv
