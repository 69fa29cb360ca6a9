// Closed-form ridge regression over an eigendecomposition of the centred Gram matrix, from
// streamed moments.
#include "common/recovery/ridge.h"

#include <Eigen/Dense>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

using MatrixD = Eigen::MatrixXd;  // column-major
using MapF =
    Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

absl::Status CheckGrid(std::span<const double> lambda_grid) {
  if (lambda_grid.empty()) return absl::InvalidArgumentError("empty ridge lambda grid");
  for (double l : lambda_grid) {
    if (!(l > 0) || !std::isfinite(l)) {
      return absl::InvalidArgumentError(absl::StrCat("ridge lambda ", l, " must be positive"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

RidgeMoments::RidgeMoments(int64_t f, int64_t d)
    : f_(f),
      d_(d),
      x_shift_(f, 0.0),
      y_shift_(d, 0.0),
      x_sum_(f, 0.0),
      y_sum_(d, 0.0),
      xx_(f * f, 0.0),
      xy_(f * d, 0.0),
      yy_(d, 0.0) {}

absl::Status RidgeMoments::Add(const float* x, const float* y, int64_t n) {
  if (n <= 0) return absl::OkStatus();
  const MatrixD xd = MapF(x, n, f_).cast<double>();
  const MatrixD yd = MapF(y, n, d_).cast<double>();
  if (!xd.allFinite() || !yd.allFinite()) {
    return absl::InvalidArgumentError("ridge rows contain NaN or infinity");
  }
  Eigen::Map<Eigen::RowVectorXd> xs(x_shift_.data(), f_), ys(y_shift_.data(), d_);
  if (n_ == 0) {
    xs = xd.colwise().mean();
    ys = yd.colwise().mean();
  }
  const MatrixD u = xd.rowwise() - xs;
  const MatrixD v = yd.rowwise() - ys;
  Eigen::Map<Eigen::RowVectorXd>(x_sum_.data(), f_) += u.colwise().sum();
  Eigen::Map<Eigen::RowVectorXd>(y_sum_.data(), d_) += v.colwise().sum();
  Eigen::Map<MatrixD>(xx_.data(), f_, f_).selfadjointView<Eigen::Lower>().rankUpdate(u.transpose());
  Eigen::Map<MatrixD>(xy_.data(), f_, d_).noalias() += u.transpose() * v;
  Eigen::Map<Eigen::RowVectorXd>(yy_.data(), d_) += v.colwise().squaredNorm();
  n_ += n;
  return absl::OkStatus();
}

// The centred moments of one block of y columns.
class RidgeSolver {
 public:
  RidgeSolver(const RidgeMoments& m, int64_t y_begin, int64_t y_count) {
    const double n = static_cast<double>(m.n_);
    const Eigen::Map<const Eigen::VectorXd> xsum(m.x_sum_.data(), m.f_);
    const Eigen::VectorXd ysum =
        Eigen::Map<const Eigen::VectorXd>(m.y_sum_.data() + y_begin, y_count);
    const Eigen::VectorXd mu_x = xsum / n, mu_y = ysum / n;
    n_ = n;
    gram = Eigen::Map<const MatrixD>(m.xx_.data(), m.f_, m.f_).selfadjointView<Eigen::Lower>();
    gram -= n * mu_x * mu_x.transpose();
    cross = Eigen::Map<const MatrixD>(m.xy_.data() + y_begin * m.f_, m.f_, y_count);
    cross -= n * mu_x * mu_y.transpose();
    y_ss = Eigen::Map<const Eigen::VectorXd>(m.yy_.data() + y_begin, y_count).sum() -
           n * mu_y.squaredNorm();
    x_mean = Eigen::Map<const Eigen::VectorXd>(m.x_shift_.data(), m.f_) + mu_x;
    y_mean = Eigen::Map<const Eigen::VectorXd>(m.y_shift_.data() + y_begin, y_count) + mu_y;
  }

  // Sum over rows of ||W^T x + b - y||^2 for wt = W^T [f, d_block], b [d_block].
  double SquaredError(const MatrixD& wt, const Eigen::VectorXd& b) const {
    const Eigen::VectorXd e = wt.transpose() * x_mean + b - y_mean;
    return (gram * wt).cwiseProduct(wt).sum() - 2.0 * cross.cwiseProduct(wt).sum() + y_ss +
           n_ * e.squaredNorm();
  }

  double n_ = 0.0;
  MatrixD gram;            // [f, f] centred X^T X
  MatrixD cross;           // [f, d_block] centred X^T Y
  double y_ss = 0.0;       // centred sum of squares of the y block
  Eigen::VectorXd x_mean;  // [f]
  Eigen::VectorXd y_mean;  // [d_block]
};

std::vector<double> DefaultRidgeGrid() { return {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0}; }

absl::StatusOr<RidgeResult> FitRidge(const RidgeMoments& train, const RidgeMoments& validation,
                                     int64_t y_begin, int64_t y_count,
                                     std::span<const double> lambda_grid) {
  const int64_t f = train.f();
  if (train.n() < 2 || f < 1 || y_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ridge fit needs >= 2 rows and positive widths (n=", train.n(), ", f=", f,
                     ", d=", y_count, ")"));
  }
  if (y_begin < 0 || y_begin + y_count > train.d() || validation.f() != f ||
      validation.d() != train.d()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ridge columns [", y_begin, ", ", y_begin + y_count, ") of training moments [", f, ", ",
        train.d(), "] and validation moments [", validation.f(), ", ", validation.d(), "]"));
  }
  if (absl::Status s = CheckGrid(lambda_grid); !s.ok()) return s;
  const RidgeSolver tr(train, y_begin, y_count);
  const RidgeSolver va(validation.n() > 0 ? validation : train, y_begin, y_count);
  const double scale = std::max(tr.gram.trace() / f, std::numeric_limits<double>::min());
  Eigen::SelfAdjointEigenSolver<MatrixD> eig(tr.gram);
  if (eig.info() != Eigen::Success) return absl::InternalError("ridge eigendecomposition failed");
  const MatrixD& q = eig.eigenvectors();
  const MatrixD qtc = q.transpose() * tr.cross;  // [f, d]

  RidgeResult best;
  best.validation_mse = std::numeric_limits<double>::infinity();
  for (double lambda : lambda_grid) {
    const Eigen::VectorXd inv =
        (eig.eigenvalues().array().max(0.0) + lambda * scale).inverse().matrix();
    const MatrixD wt = q * (inv.asDiagonal() * qtc);  // [f, d] = W^T
    const Eigen::VectorXd b = tr.y_mean - wt.transpose() * tr.x_mean;
    const double mse = va.SquaredError(wt, b) / (va.n_ * static_cast<double>(y_count));
    if (mse < best.validation_mse) {
      best.validation_mse = mse;
      best.lambda = lambda;
      best.w.assign(y_count * f, 0.0);
      // w is [d, f] row-major, i.e. W^T column-major.
      Eigen::Map<MatrixD>(best.w.data(), f, y_count) = wt;
      best.b.assign(b.data(), b.data() + y_count);
    }
  }
  return best;
}

absl::StatusOr<RidgeResult> FitRidge(const RidgeData& train, const RidgeData& validation, int64_t f,
                                     int64_t d, std::span<const double> lambda_grid) {
  if (train.n < 2 || f < 1 || d < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ridge fit needs >= 2 rows and positive widths (n=", train.n, ", f=", f, ", d=", d, ")"));
  }
  RidgeMoments tr(f, d), va(f, d);
  if (absl::Status s = tr.Add(train.x, train.y, train.n); !s.ok()) {
    return absl::InvalidArgumentError("ridge training data contains NaN or infinity");
  }
  if (absl::Status s = va.Add(validation.x, validation.y, validation.n); !s.ok()) {
    return absl::InvalidArgumentError("ridge validation data contains NaN or infinity");
  }
  return FitRidge(tr, va, 0, d, lambda_grid);
}

}  // namespace riskkv
