// Ridge regression with intercept in closed form, double precision: y ~= W x + b, with the
// regularisation strength chosen on validation data from a grid.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace riskkv {

struct RidgeData {
  const float* x = nullptr;  // [n, f] row-major
  const float* y = nullptr;  // [n, d] row-major
  int64_t n = 0;
};

struct RidgeResult {
  std::vector<double> w;  // [d, f] row-major: y = W x + b
  std::vector<double> b;  // [d]
  double lambda = 0.0;    // chosen grid value (relative to mean diagonal of centred X^T X)
  double validation_mse = 0.0;
};

// Default grid of relative regularisation strengths.
std::vector<double> DefaultRidgeGrid();

// Centres X and Y on the training means, then for each relative lambda in the grid solves
// (Xc^T Xc + lambda * tr(Xc^T Xc) / f * I) W^T = Xc^T Yc through one eigendecomposition, and
// keeps the lambda with the lowest mean squared error on `validation` (on the training data
// itself when validation.n == 0).
absl::StatusOr<RidgeResult> FitRidge(const RidgeData& train, const RidgeData& validation, int64_t f,
                                     int64_t d, std::span<const double> lambda_grid);

}  // namespace riskkv
