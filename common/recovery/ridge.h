// Ridge regression with intercept in closed form, double precision: y ~= W x + b, with the
// regularisation strength chosen on validation data from a grid. The fit needs only the rows'
// moments, so rows can stream through a RidgeMoments instead of being held.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace riskkv {

struct RidgeData {
  const float* x = nullptr;  // [n, f] row-major
  const float* y = nullptr;  // [n, d] row-major
  int64_t n = 0;
};

// The sufficient statistics of paired rows (x of width f, y of width d) for ridge fits,
// accumulated in double: the count, the sums, X^T X, X^T Y and each y column's sum of squares,
// all about a shift fixed by the first rows added (their means), so that centring on the final
// means afterwards does not cancel away precision.
class RidgeMoments {
 public:
  RidgeMoments(int64_t f, int64_t d);

  int64_t f() const { return f_; }
  int64_t d() const { return d_; }
  int64_t n() const { return n_; }

  // Adds n rows: x [n, f] and y [n, d], row-major f32. Rows containing NaN or infinity are
  // refused, and then nothing is added.
  absl::Status Add(const float* x, const float* y, int64_t n);

 private:
  friend class RidgeSolver;
  int64_t f_, d_, n_ = 0;
  std::vector<double> x_shift_, y_shift_;  // [f], [d]
  std::vector<double> x_sum_, y_sum_;      // sums of (x - x_shift), (y - y_shift)
  std::vector<double> xx_;                 // [f, f] lower triangle of sum (x-xs)(x-xs)^T
  std::vector<double> xy_;                 // [f, d] sum (x-xs)(y-ys)^T, column-major
  std::vector<double> yy_;                 // [d] sum (y-ys)^2 per column
};

struct RidgeResult {
  std::vector<double> w;  // [d, f] row-major: y = W x + b
  std::vector<double> b;  // [d]
  double lambda = 0.0;    // chosen grid value (relative to mean diagonal of centred X^T X)
  double validation_mse = 0.0;
};

// Default grid of relative regularisation strengths.
std::vector<double> DefaultRidgeGrid();

// Fits y columns [y_begin, y_begin + y_count) (so several targets can share one X^T X):
// centres on the training means, then for each relative lambda in the grid solves
// (Xc^T Xc + lambda * tr(Xc^T Xc) / f * I) W^T = Xc^T Yc through one eigendecomposition, and
// keeps the lambda with the lowest mean squared error on `validation` (on the training rows
// themselves when validation has none). Both must have the same widths.
absl::StatusOr<RidgeResult> FitRidge(const RidgeMoments& train, const RidgeMoments& validation,
                                     int64_t y_begin, int64_t y_count,
                                     std::span<const double> lambda_grid);

// The same fit of every y column from rows held in memory.
absl::StatusOr<RidgeResult> FitRidge(const RidgeData& train, const RidgeData& validation, int64_t f,
                                     int64_t d, std::span<const double> lambda_grid);

}  // namespace riskkv
