// Folding a ridge predictor of a layer's normalised attention input into that layer's frozen
// K/V projections: both are affine, so their composition is one affine map per output.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "common/recovery/folded_map.h"
#include "common/recovery/ridge.h"

namespace riskkv {

// With attn_in ~= W x + b (W [hidden, F]) and K = Wk attn_in + bk (Wk [kv_width, hidden]):
//   A_k = Wk W,  c_k = Wk b + bk, and likewise for V. K stays pre-RoPE.
absl::StatusOr<LayerFit> FoldIntoProjections(const RidgeResult& ridge, int64_t n_features,
                                             int32_t layer, const Model& model);

}  // namespace riskkv
