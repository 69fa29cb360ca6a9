// Closed-form ridge regression over an eigendecomposition of the centred Gram matrix.
#include "common/recovery/ridge.h"

#include <Eigen/Dense>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapF =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

}  // namespace

std::vector<double> DefaultRidgeGrid() { return {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0}; }

absl::StatusOr<RidgeResult> FitRidge(const RidgeData& train, const RidgeData& validation, int64_t f,
                                     int64_t d, std::span<const double> lambda_grid) {
  if (train.n < 2 || f < 1 || d < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ridge fit needs >= 2 rows and positive widths (n=", train.n, ", f=", f, ", d=", d, ")"));
  }
  if (lambda_grid.empty()) return absl::InvalidArgumentError("empty ridge lambda grid");
  for (double l : lambda_grid) {
    if (!(l > 0) || !std::isfinite(l)) {
      return absl::InvalidArgumentError(absl::StrCat("ridge lambda ", l, " must be positive"));
    }
  }
  const MatrixD x = MapF(train.x, train.n, f).cast<double>();
  const MatrixD y = MapF(train.y, train.n, d).cast<double>();
  if (!x.allFinite() || !y.allFinite()) {
    return absl::InvalidArgumentError("ridge training data contains NaN or infinity");
  }
  const Eigen::RowVectorXd x_mean = x.colwise().mean();
  const Eigen::RowVectorXd y_mean = y.colwise().mean();
  const MatrixD xc = x.rowwise() - x_mean;
  const MatrixD yc = y.rowwise() - y_mean;
  const MatrixD gram = xc.transpose() * xc;   // [f, f]
  const MatrixD cross = xc.transpose() * yc;  // [f, d]
  const double scale = std::max(gram.trace() / f, std::numeric_limits<double>::min());
  Eigen::SelfAdjointEigenSolver<MatrixD> eig(gram);
  if (eig.info() != Eigen::Success) return absl::InternalError("ridge eigendecomposition failed");
  const MatrixD& q = eig.eigenvectors();
  const MatrixD qtc = q.transpose() * cross;  // [f, d]

  const RidgeData& val = validation.n > 0 ? validation : train;
  const MatrixD xv = MapF(val.x, val.n, f).cast<double>();
  const MatrixD yv = MapF(val.y, val.n, d).cast<double>();

  RidgeResult best;
  best.validation_mse = std::numeric_limits<double>::infinity();
  for (double lambda : lambda_grid) {
    const Eigen::VectorXd inv =
        (eig.eigenvalues().array().max(0.0) + lambda * scale).inverse().matrix();
    const MatrixD wt = q * (inv.asDiagonal() * qtc);  // [f, d] = W^T
    const Eigen::RowVectorXd b = y_mean - x_mean * wt;
    const MatrixD pred = (xv * wt).rowwise() + b;
    const double mse = (pred - yv).squaredNorm() / static_cast<double>(val.n * d);
    if (mse < best.validation_mse) {
      best.validation_mse = mse;
      best.lambda = lambda;
      best.w.assign(d * f, 0.0);
      Eigen::Map<MatrixD>(best.w.data(), d, f) = wt.transpose();
      best.b.assign(b.data(), b.data() + d);
    }
  }
  return best;
}

}  // namespace riskkv
