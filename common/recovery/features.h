// RISK-KV predictor inputs: for each token, the exact KV of a group's anchor layers at that
// same position, keys returned to pre-RoPE coordinates.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/recovery/layer_group.h"
#include "kernels/backend.h"

namespace riskkv {

// Features per token: for each anchor (group.anchors order) its pre-RoPE key then its value,
// each kv_width wide, so F = 2 * anchors * kv_width.
inline int64_t FeatureWidth(const LayerGroup& group, int64_t kv_width) {
  return 2 * static_cast<int64_t>(group.anchors.size()) * kv_width;
}

// Writes features of positions [begin, begin + count) into out [count, F] (row-major f32).
// Inverse RoPE runs on the backend in the model's own RoPE layout.
absl::Status BuildFeatures(const KvCache& cache, const LayerGroup& group, const ModelConfig& config,
                           Backend& backend, int64_t begin, int64_t count, float* out);

}  // namespace riskkv
