// A decorrelating transform of one layer's keys or values, one per KV head: the rows' mean and an
// orthonormal basis whose components are ordered by the variance they carry on the rows the
// transform was fitted to. The transform codec (transform_codec.h) codes each row's coordinates
// in that basis; both ends of a migration hold the same transform, fitted once per model.
//
// - PCA: the eigenvectors of the head's covariance (KVTC's decorrelating transform), so the
//   variance concentrates in the first components and the last carry almost none.
// - Hadamard: the normalised Walsh-Hadamard matrix (a fixed rotation that spreads outlying
//   channels over all components), for comparison; head_dim must be a power of two.
// - Identity: the channels themselves, for comparison.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace riskkv {

enum class TransformKind : uint8_t { kPca, kHadamard, kIdentity };

std::string_view TransformKindName(TransformKind kind);
// "pca", "hadamard" or "identity"; InvalidArgument naming anything else.
absl::StatusOr<TransformKind> ParseTransformKind(std::string_view name);

struct HeadTransform {
  std::vector<float> mean;      // [dim]
  std::vector<float> basis;     // [dim, dim]: row i is component i, unit length, rows orthogonal
  std::vector<float> variance;  // [dim]: of each component on the fitted rows (for PCA the
                                // covariance's eigenvalues, non-increasing)
};

struct LayerTransform {
  int64_t heads = 0;
  int64_t dim = 0;
  std::vector<HeadTransform> head;  // [heads]

  // The root mean square of the rows around their mean, over every head and component: the
  // scale that the codec's step is chosen relative to (transform_codec.h).
  double Rms() const;
};

// Fits a transform of `kind` to rows [n, heads * dim] (f32, row-major; n >= 2). Non-finite
// values count as the head's mean. InvalidArgument for shapes < 1, n < 2, or a Hadamard whose
// dim is not a power of two.
absl::StatusOr<LayerTransform> FitTransform(TransformKind kind, const float* rows, int64_t n,
                                            int64_t heads, int64_t dim);

// The moments of rows added a batch at a time (the sum and sum of outer products of each head, in
// double), to fit a transform to more rows than are held at once. A head's row that holds a
// non-finite value is left out of that head's moments.
class TransformMoments {
 public:
  // heads and dim >= 1 (FitTransform refuses others).
  TransformMoments(int64_t heads, int64_t dim);
  // Adds rows [n, heads * dim].
  void Add(const float* rows, int64_t n);
  // The rows each head's moments hold.
  int64_t rows(int64_t head) const { return count_[static_cast<size_t>(head)]; }
  // FitTransform over every row added: InvalidArgument as FitTransform, counting each head's
  // rows.
  absl::StatusOr<LayerTransform> Fit(TransformKind kind) const;

 private:
  int64_t heads_, dim_;
  std::vector<int64_t> count_;  // [heads]
  std::vector<double> sum_;     // [heads, dim]
  std::vector<double> outer_;   // [heads, dim, dim]
};

// Whether `t` is a transform of this shape that a codec can use: heads and dim >= 1 and as given,
// every vector of its size, every value finite, variances >= 0, and every basis orthonormal within
// 1e-3 (|B B^T - I| elementwise). InvalidArgument naming the head and what is wrong.
absl::Status CheckTransform(const LayerTransform& t, int64_t heads, int64_t dim);

}  // namespace riskkv
