// RISK-KV reconstruction on the GPU: a predictor bank's folded maps uploaded once per bank
// (each group's [A_k; A_v] of every target stacked into one f32 matrix), applied to a
// GpuSession's device KV as one GEMM per group (see rebuild.h for the CPU path, the oracle).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gpu_model.h"
#include "common/recovery/predictor_bank.h"

namespace riskkv {

// A group's maps as the engine applies them: for each target its A_k then its A_v, stacked
// row-wise into a [T * 2 * kv_width, F] f32 matrix, and its c_k then c_v into [T * 2 * kv_width].
// InvalidArgument when a map does not fit features of the group's width.
absl::Status StackGroupMaps(const FoldedGroup& group, int64_t kv_width, std::vector<float>* a,
                            std::vector<float>* c);

class GpuPredictors {
 public:
  static absl::StatusOr<std::unique_ptr<GpuPredictors>> Create(GpuModel& model,
                                                               const PredictorBank& bank);

  // Rebuilds every target layer of `group` (one of the bank's groups) for rows
  // [begin, begin + count), after the uploads of its anchors marked so far. The work is queued
  // on the device; GpuSession::Synchronize or the next forward pass waits for it.
  absl::Status Rebuild(GpuSession& session, const FoldedGroup& group, int64_t begin,
                       int64_t count) const;

  const PredictorBank& bank() const { return bank_; }

 private:
  GpuPredictors(const PredictorBank& bank, std::unique_ptr<cuda::Predictors> p)
      : bank_(bank), predictors_(std::move(p)) {}
  const PredictorBank& bank_;
  std::unique_ptr<cuda::Predictors> predictors_;
};

}  // namespace riskkv
