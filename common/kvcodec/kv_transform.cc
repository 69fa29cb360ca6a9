// Fitting and checking the KV transforms (see kv_transform.h).
#include "common/kvcodec/kv_transform.h"

#include <Eigen/Dense>
#include <algorithm>
#include <bit>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The mean of head h's rows and their covariance, non-finite values counting as the mean.
void Moments(const float* rows, int64_t n, int64_t heads, int64_t dim, int64_t h,
             Eigen::VectorXd* mean, MatrixD* cov) {
  const int64_t width = heads * dim;
  Eigen::VectorXd sum = Eigen::VectorXd::Zero(dim);
  Eigen::VectorXd count = Eigen::VectorXd::Zero(dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < dim; ++i) {
      const float v = rows[t * width + h * dim + i];
      if (std::isfinite(v)) {
        sum[i] += v;
        count[i] += 1;
      }
    }
  }
  *mean = sum.cwiseQuotient(count.cwiseMax(1.0));
  MatrixD centred(n, dim);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < dim; ++i) {
      const float v = rows[t * width + h * dim + i];
      centred(t, i) = std::isfinite(v) ? v - (*mean)[i] : 0.0;
    }
  }
  *cov = centred.transpose() * centred / static_cast<double>(n);
}

// Each component's variance on the fitted rows: diag(B C B^T).
std::vector<float> ComponentVariance(const MatrixD& basis, const MatrixD& cov) {
  const MatrixD bc = basis * cov;
  std::vector<float> var(static_cast<size_t>(basis.rows()));
  for (int64_t i = 0; i < basis.rows(); ++i) {
    var[static_cast<size_t>(i)] = static_cast<float>(std::max(0.0, bc.row(i).dot(basis.row(i))));
  }
  return var;
}

// The basis of `kind` for this covariance; for PCA, *eigenvalues receives the components'
// variances (its eigenvalues, largest first, negative rounding clamped to 0).
MatrixD Basis(TransformKind kind, const MatrixD& cov, int64_t dim,
              std::vector<float>* eigenvalues) {
  MatrixD b(dim, dim);
  switch (kind) {
    case TransformKind::kIdentity:
      b.setIdentity();
      return b;
    case TransformKind::kHadamard: {
      const double s = 1.0 / std::sqrt(static_cast<double>(dim));
      for (int64_t i = 0; i < dim; ++i) {
        for (int64_t j = 0; j < dim; ++j) {
          b(i, j) = (std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -s : s);
        }
      }
      return b;
    }
    case TransformKind::kPca: {
      const Eigen::SelfAdjointEigenSolver<MatrixD> eig(cov);
      // Ascending eigenvalues: component i is the eigenvector of the i-th largest, its sign
      // fixed so that its largest entry is positive.
      eigenvalues->resize(static_cast<size_t>(dim));
      for (int64_t i = 0; i < dim; ++i) {
        (*eigenvalues)[static_cast<size_t>(i)] =
            static_cast<float>(std::max(0.0, eig.eigenvalues()[dim - 1 - i]));
        Eigen::VectorXd v = eig.eigenvectors().col(dim - 1 - i);
        Eigen::Index top = 0;
        v.cwiseAbs().maxCoeff(&top);
        if (v[top] < 0) v = -v;
        b.row(i) = v.transpose();
      }
      return b;
    }
  }
  return b;
}

// The transform of `kind` of one head whose rows have this mean and covariance.
HeadTransform HeadFromMoments(TransformKind kind, const Eigen::VectorXd& mean, const MatrixD& cov,
                              int64_t dim) {
  std::vector<float> eigenvalues;
  const MatrixD basis = Basis(kind, cov, dim, &eigenvalues);
  HeadTransform out;
  out.mean.assign(mean.data(), mean.data() + dim);
  out.basis.resize(static_cast<size_t>(dim * dim));
  for (int64_t i = 0; i < dim * dim; ++i) out.basis[i] = static_cast<float>(basis.data()[i]);
  out.variance = kind == TransformKind::kPca ? eigenvalues : ComponentVariance(basis, cov);
  return out;
}

// InvalidArgument for a Hadamard transform of a head_dim that is not a power of two.
absl::Status CheckKindFits(TransformKind kind, int64_t dim) {
  if (kind == TransformKind::kHadamard && !std::has_single_bit(static_cast<uint64_t>(dim))) {
    return absl::InvalidArgumentError(
        absl::StrCat("a Hadamard transform needs a power-of-two head_dim, not ", dim));
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view TransformKindName(TransformKind kind) {
  switch (kind) {
    case TransformKind::kPca:
      return "pca";
    case TransformKind::kHadamard:
      return "hadamard";
    case TransformKind::kIdentity:
      return "identity";
  }
  return "unknown";
}

absl::StatusOr<TransformKind> ParseTransformKind(std::string_view name) {
  for (TransformKind k :
       {TransformKind::kPca, TransformKind::kHadamard, TransformKind::kIdentity}) {
    if (name == TransformKindName(k)) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("transform '", std::string(name), "' is not pca, hadamard or identity"));
}

double LayerTransform::Rms() const {
  double sum = 0;
  int64_t count = 0;
  for (const HeadTransform& h : head) {
    for (float v : h.variance) sum += v;
    count += static_cast<int64_t>(h.variance.size());
  }
  return count > 0 ? std::sqrt(sum / static_cast<double>(count)) : 0.0;
}

absl::StatusOr<LayerTransform> FitTransform(TransformKind kind, const float* rows, int64_t n,
                                            int64_t heads, int64_t dim) {
  if (heads < 1 || dim < 1 || n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transform needs heads and dim >= 1 and two "
                     "rows or more, not ",
                     heads, " heads of ", dim, " over ", n, " rows"));
  }
  if (absl::Status s = CheckKindFits(kind, dim); !s.ok()) return s;
  LayerTransform t{.heads = heads, .dim = dim, .head = {}};
  t.head.resize(static_cast<size_t>(heads));
  for (int64_t h = 0; h < heads; ++h) {
    Eigen::VectorXd mean;
    MatrixD cov;
    Moments(rows, n, heads, dim, h, &mean, &cov);
    t.head[static_cast<size_t>(h)] = HeadFromMoments(kind, mean, cov, dim);
  }
  return t;
}

TransformMoments::TransformMoments(int64_t heads, int64_t dim)
    : heads_(heads),
      dim_(dim),
      count_(static_cast<size_t>(std::max<int64_t>(heads, 0)), 0),
      sum_(static_cast<size_t>(std::max<int64_t>(heads * dim, 0)), 0.0),
      outer_(static_cast<size_t>(std::max<int64_t>(heads * dim * dim, 0)), 0.0) {}

void TransformMoments::Add(const float* rows, int64_t n) {
  if (heads_ < 1 || dim_ < 1) return;
  const int64_t width = heads_ * dim_;
  std::vector<double> x(static_cast<size_t>(dim_));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads_; ++h) {
      const float* row = rows + t * width + h * dim_;
      bool finite = true;
      for (int64_t i = 0; i < dim_; ++i) {
        finite = finite && std::isfinite(row[i]);
        x[i] = row[i];
      }
      if (!finite) continue;
      ++count_[h];
      double* s = &sum_[h * dim_];
      double* o = &outer_[h * dim_ * dim_];
      for (int64_t i = 0; i < dim_; ++i) {
        s[i] += x[i];
        for (int64_t j = i; j < dim_; ++j) o[i * dim_ + j] += x[i] * x[j];
      }
    }
  }
}

absl::StatusOr<LayerTransform> TransformMoments::Fit(TransformKind kind) const {
  int64_t fewest = heads_ > 0 ? count_[0] : 0;
  for (int64_t c : count_) fewest = std::min(fewest, c);
  if (heads_ < 1 || dim_ < 1 || fewest < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transform needs heads and dim >= 1 and two rows or more, not ", heads_,
                     " heads of ", dim_, " over ", fewest, " rows"));
  }
  if (absl::Status s = CheckKindFits(kind, dim_); !s.ok()) return s;
  LayerTransform t{.heads = heads_, .dim = dim_, .head = {}};
  t.head.resize(static_cast<size_t>(heads_));
  for (int64_t h = 0; h < heads_; ++h) {
    const auto n = static_cast<double>(count_[h]);
    Eigen::VectorXd mean(dim_);
    for (int64_t i = 0; i < dim_; ++i) mean[i] = sum_[h * dim_ + i] / n;
    MatrixD cov(dim_, dim_);
    for (int64_t i = 0; i < dim_; ++i) {
      for (int64_t j = i; j < dim_; ++j) {
        cov(i, j) = outer_[(h * dim_ + i) * dim_ + j] / n - mean[i] * mean[j];
        cov(j, i) = cov(i, j);
      }
    }
    t.head[static_cast<size_t>(h)] = HeadFromMoments(kind, mean, cov, dim_);
  }
  return t;
}

absl::Status CheckTransform(const LayerTransform& t, int64_t heads, int64_t dim) {
  if (heads < 1 || dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a transform needs heads and dim >= 1, not ", heads, " and ", dim));
  }
  if (t.heads != heads || t.dim != dim || static_cast<int64_t>(t.head.size()) != heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("transform of ", t.head.size(), " heads (", t.heads, " declared) of ", t.dim,
                     " does not match ", heads, " KV heads of ", dim));
  }
  for (int64_t h = 0; h < heads; ++h) {
    const HeadTransform& ht = t.head[static_cast<size_t>(h)];
    const auto bad = [h](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat("transform head ", h, ": ", what));
    };
    if (static_cast<int64_t>(ht.mean.size()) != dim ||
        static_cast<int64_t>(ht.variance.size()) != dim ||
        static_cast<int64_t>(ht.basis.size()) != dim * dim) {
      return bad(absl::StrCat(ht.mean.size(), " means, ", ht.variance.size(), " variances and ",
                              ht.basis.size(), " basis entries for head_dim ", dim));
    }
    for (int64_t i = 0; i < dim; ++i) {
      if (!std::isfinite(ht.mean[i])) return bad(absl::StrCat("mean ", i, " is ", ht.mean[i]));
      if (!(ht.variance[i] >= 0) || !std::isfinite(ht.variance[i])) {
        return bad(absl::StrCat("variance ", i, " is ", ht.variance[i]));
      }
    }
    for (float v : ht.basis) {
      if (!std::isfinite(v)) return bad(absl::StrCat("the basis holds ", v));
    }
    const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> b(
        ht.basis.data(), dim, dim);
    const Eigen::MatrixXd gram = b.cast<double>() * b.cast<double>().transpose();
    for (int64_t i = 0; i < dim; ++i) {
      for (int64_t j = 0; j < dim; ++j) {
        const double want = i == j ? 1.0 : 0.0;
        if (std::abs(gram(i, j) - want) > 1e-3) {
          return bad(absl::StrCat("the basis is not orthonormal: row ", i, " · row ", j, " = ",
                                  gram(i, j)));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace riskkv
