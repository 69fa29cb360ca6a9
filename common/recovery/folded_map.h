// The folded RISK-KV predictor of one target layer: the ridge map from anchor features to the
// layer's normalised attention input, composed with the layer's frozen K/V projections, so that
//   K_pre_rope = A_k x + c_k,   V = A_v x + c_v
// for a feature row x (see features.h). K is rotated by RoPE afterwards.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/recovery/layer_group.h"
#include "kernels/backend.h"

namespace riskkv {

// Fitted maps in double precision, as calibration produces them.
struct LayerFit {
  int32_t layer = 0;
  int64_t n_features = 0;        // F
  int64_t kv_width = 0;          // n_kv_heads * head_dim
  std::vector<double> a_k, a_v;  // [kv_width, F] row-major
  std::vector<double> c_k, c_v;  // [kv_width]
  double ridge_lambda = 0.0;     // regularisation chosen on validation data
};

struct GroupFit {
  LayerGroup group;
  std::vector<LayerFit> layers;  // one per target, in group.targets order
};

// A folded map ready to run: the matrices are WeightMatrix views (F32 or F16) so the backend's
// MatMul applies them; storage belongs to whoever made the view (a PredictorBank).
struct FoldedMap {
  int32_t layer = 0;
  WeightMatrix k, v;                // [kv_width, F]
  std::span<const float> c_k, c_v;  // [kv_width]
};

struct FoldedGroup {
  LayerGroup group;
  std::vector<FoldedMap> maps;  // one per target, in group.targets order
};

}  // namespace riskkv
