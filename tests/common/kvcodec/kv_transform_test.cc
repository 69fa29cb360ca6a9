// The KV transforms: PCA recovers a known covariance's eigenvectors and variances, the fixed
// kinds are the matrices they name with variances measured on the rows, and CheckTransform
// refuses every malformed transform.
#include "common/kvcodec/kv_transform.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace riskkv {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kHeads = 2, kDim = 8, kWidth = kHeads * kDim;

// A random orthonormal matrix [dim, dim] (rows), by Gram-Schmidt in double.
std::vector<double> RandomRotation(int64_t dim, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0, 1);
  std::vector<double> q(dim * dim);
  for (int64_t i = 0; i < dim; ++i) {
    double* r = &q[i * dim];
    for (int64_t j = 0; j < dim; ++j) r[j] = g(rng);
    for (int64_t k = 0; k < i; ++k) {
      double d = 0;
      for (int64_t j = 0; j < dim; ++j) d += r[j] * q[k * dim + j];
      for (int64_t j = 0; j < dim; ++j) r[j] -= d * q[k * dim + j];
    }
    double norm = 0;
    for (int64_t j = 0; j < dim; ++j) norm += r[j] * r[j];
    for (int64_t j = 0; j < dim; ++j) r[j] /= std::sqrt(norm);
  }
  return q;
}

// Rows whose head h is mean_h + sum_i sqrt(lambda_i) z_i Q_h[i], z standard normal: component i of
// Q_h carries variance lambda_i = 4^(-i) * (h + 1) in expectation.
struct Synthetic {
  std::vector<float> rows;
  std::vector<std::vector<double>> q;  // per head
  std::vector<double> lambda(int64_t h) const {
    std::vector<double> l(kDim);
    for (int64_t i = 0; i < kDim; ++i) l[i] = std::pow(4.0, -static_cast<double>(i)) * (h + 1);
    return l;
  }
};

Synthetic MakeRows(int64_t n, uint32_t seed) {
  Synthetic s;
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0, 1);
  s.rows.assign(n * kWidth, 0.f);
  for (int64_t h = 0; h < kHeads; ++h) {
    s.q.push_back(RandomRotation(kDim, seed + 17 * static_cast<uint32_t>(h)));
    const std::vector<double> l = s.lambda(h);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < kDim; ++i) {
        const double z = g(rng) * std::sqrt(l[i]);
        for (int64_t j = 0; j < kDim; ++j) {
          s.rows[t * kWidth + h * kDim + j] += static_cast<float>(z * s.q[h][i * kDim + j]);
        }
      }
      for (int64_t j = 0; j < kDim; ++j) s.rows[t * kWidth + h * kDim + j] += 3.0f + 0.5f * j;
    }
  }
  return s;
}

TEST(KvTransformTest, PcaFindsTheCovariancesEigenvectors) {
  const int64_t n = 20000;
  const Synthetic s = MakeRows(n, 7);
  auto t = FitTransform(TransformKind::kPca, s.rows.data(), n, kHeads, kDim);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(CheckTransform(*t, kHeads, kDim).ok());
  for (int64_t h = 0; h < kHeads; ++h) {
    const HeadTransform& ht = t->head[h];
    const std::vector<double> l = s.lambda(h);
    for (int64_t j = 0; j < kDim; ++j) EXPECT_NEAR(ht.mean[j], 3.0 + 0.5 * j, 0.03) << h;
    for (int64_t i = 0; i < kDim; ++i) {
      // Sampling error of a variance over n normal draws: about sqrt(2 / n) = 1% of it.
      EXPECT_NEAR(ht.variance[i], l[i], 0.05 * l[i]) << "head " << h << " component " << i;
      if (i > 0) {
        EXPECT_LE(ht.variance[i], ht.variance[i - 1]);
      }
    }
    // The components that carry most variance are the generating directions (up to sign);
    // eigenvalues 4x apart keep them well separated.
    for (int64_t i = 0; i < 3; ++i) {
      double d = 0;
      for (int64_t j = 0; j < kDim; ++j) d += ht.basis[i * kDim + j] * s.q[h][i * kDim + j];
      EXPECT_GT(std::abs(d), 0.99) << "head " << h << " component " << i;
    }
  }
}

TEST(KvTransformTest, VarianceIsThatOfTheProjectedRows) {
  const int64_t n = 500;
  const Synthetic s = MakeRows(n, 3);
  for (TransformKind k :
       {TransformKind::kPca, TransformKind::kHadamard, TransformKind::kIdentity}) {
    auto t = FitTransform(k, s.rows.data(), n, kHeads, kDim);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(CheckTransform(*t, kHeads, kDim).ok()) << TransformKindName(k);
    for (int64_t h = 0; h < kHeads; ++h) {
      const HeadTransform& ht = t->head[h];
      for (int64_t i = 0; i < kDim; ++i) {
        double sum = 0, sq = 0;
        for (int64_t r = 0; r < n; ++r) {
          double y = 0;
          for (int64_t j = 0; j < kDim; ++j) {
            y += ht.basis[i * kDim + j] * s.rows[r * kWidth + h * kDim + j];
          }
          sum += y;
          sq += y * y;
        }
        const double var = sq / n - (sum / n) * (sum / n);
        EXPECT_NEAR(ht.variance[i], var, 1e-4 * (1 + var)) << TransformKindName(k) << " " << i;
      }
    }
  }
}

TEST(KvTransformTest, FixedKindsAreTheMatricesTheyName) {
  const Synthetic s = MakeRows(64, 5);
  auto id = FitTransform(TransformKind::kIdentity, s.rows.data(), 64, kHeads, kDim);
  auto had = FitTransform(TransformKind::kHadamard, s.rows.data(), 64, kHeads, kDim);
  ASSERT_TRUE(id.ok() && had.ok());
  // Sylvester's 8 x 8 Hadamard matrix, written out.
  const char* signs[kDim] = {"++++++++", "+-+-+-+-", "++--++--", "+--++--+",
                             "++++----", "+-+--+-+", "++----++", "+--+-++-"};
  const double a = 1.0 / std::sqrt(static_cast<double>(kDim));
  for (int64_t i = 0; i < kDim; ++i) {
    for (int64_t j = 0; j < kDim; ++j) {
      EXPECT_EQ(id->head[1].basis[i * kDim + j], i == j ? 1.0f : 0.0f);
      EXPECT_FLOAT_EQ(had->head[0].basis[i * kDim + j],
                      static_cast<float>(signs[i][j] == '-' ? -a : a))
          << i << " " << j;
    }
  }
  EXPECT_THAT(FitTransform(TransformKind::kHadamard, s.rows.data(), 64, 1, 12).status().message(),
              HasSubstr("power-of-two"));
}

TEST(KvTransformTest, NonFiniteValuesCountAsTheMean) {
  std::vector<float> rows = {1,
                             10,
                             3,
                             20,
                             std::numeric_limits<float>::quiet_NaN(),
                             30,
                             5,
                             std::numeric_limits<float>::infinity()};
  auto t = FitTransform(TransformKind::kIdentity, rows.data(), 4, 1, 2);
  ASSERT_TRUE(t.ok());
  EXPECT_FLOAT_EQ(t->head[0].mean[0], 3.0f);   // (1 + 3 + 5) / 3
  EXPECT_FLOAT_EQ(t->head[0].mean[1], 20.0f);  // (10 + 20 + 30) / 3
  // Deviations 2, 0, 0 (the NaN), 2 over 4 rows; 10, 0, 10, 0 (the infinity).
  EXPECT_FLOAT_EQ(t->head[0].variance[0], 2.0f);
  EXPECT_FLOAT_EQ(t->head[0].variance[1], 50.0f);
}

TEST(KvTransformTest, FitRefusesBadShapes) {
  std::vector<float> rows(kWidth * 4, 1.0f);
  EXPECT_FALSE(FitTransform(TransformKind::kPca, rows.data(), 1, kHeads, kDim).ok());
  EXPECT_FALSE(FitTransform(TransformKind::kPca, rows.data(), 4, 0, kDim).ok());
  EXPECT_FALSE(FitTransform(TransformKind::kPca, rows.data(), 4, kHeads, 0).ok());
  EXPECT_TRUE(ParseTransformKind("pca").ok());
  EXPECT_THAT(ParseTransformKind("dct").status().message(), HasSubstr("'dct'"));
}

TEST(KvTransformTest, CheckRefusesMalformedTransforms) {
  const Synthetic s = MakeRows(200, 9);
  auto fitted = FitTransform(TransformKind::kPca, s.rows.data(), 200, kHeads, kDim);
  ASSERT_TRUE(fitted.ok());
  const LayerTransform good = *fitted;
  EXPECT_TRUE(CheckTransform(good, kHeads, kDim).ok());
  EXPECT_THAT(CheckTransform(good, kHeads + 1, kDim).message(), HasSubstr("does not match"));
  EXPECT_THAT(CheckTransform(good, kHeads, kDim * 2).message(), HasSubstr("does not match"));
  EXPECT_THAT(CheckTransform(LayerTransform{}, 0, -1).message(), HasSubstr(">= 1"));

  LayerTransform t = good;
  t.head[1].mean.pop_back();
  EXPECT_THAT(CheckTransform(t, kHeads, kDim).message(), HasSubstr("head 1"));
  t = good;
  t.head[0].mean[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(CheckTransform(t, kHeads, kDim).message(), HasSubstr("mean 3"));
  t = good;
  t.head[0].variance[2] = -1.0f;
  EXPECT_THAT(CheckTransform(t, kHeads, kDim).message(), HasSubstr("variance 2"));
  t = good;
  t.head[1].basis[5] += 0.01f;
  EXPECT_THAT(CheckTransform(t, kHeads, kDim).message(), HasSubstr("not orthonormal"));
  t = good;
  t.head[1].basis[0] = std::numeric_limits<float>::infinity();
  EXPECT_THAT(CheckTransform(t, kHeads, kDim).message(), HasSubstr("basis holds"));
}

// Moments added in batches fit what FitTransform fits to all the rows at once (in double both, so
// equal to rounding), and a head's row with a non-finite value is left out of that head only.
TEST(KvTransformTest, MomentsInBatchesFitWhatTheRowsFitAtOnce) {
  const Synthetic s = MakeRows(3000, 21);
  for (TransformKind kind : {TransformKind::kPca, TransformKind::kHadamard}) {
    TransformMoments m(kHeads, kDim);
    m.Add(s.rows.data(), 1000);
    m.Add(s.rows.data() + 1000 * kWidth, 1);
    m.Add(s.rows.data() + 1001 * kWidth, 1999);
    EXPECT_EQ(m.rows(0), 3000);
    auto batched = m.Fit(kind);
    auto whole = FitTransform(kind, s.rows.data(), 3000, kHeads, kDim);
    ASSERT_TRUE(batched.ok()) << batched.status();
    ASSERT_TRUE(whole.ok());
    EXPECT_TRUE(CheckTransform(*batched, kHeads, kDim).ok());
    for (int64_t h = 0; h < kHeads; ++h) {
      const HeadTransform &a = batched->head[h], &b = whole->head[h];
      for (int64_t i = 0; i < kDim; ++i) {
        EXPECT_NEAR(a.mean[i], b.mean[i], 1e-5 * (1 + std::abs(b.mean[i])));
        EXPECT_NEAR(a.variance[i], b.variance[i], 1e-4 * b.variance[0]);
      }
      // Components with well-separated variances (a factor of 4) and the same sign rule.
      for (int64_t i = 0; i < kDim * kDim; ++i) EXPECT_NEAR(a.basis[i], b.basis[i], 1e-3) << i;
    }
  }
  // A NaN in head 1 of one row: head 0 keeps that row, head 1 fits the others exactly.
  std::vector<float> rows = s.rows;
  rows[5 * kWidth + kDim + 3] = std::numeric_limits<float>::quiet_NaN();
  TransformMoments m(kHeads, kDim);
  m.Add(rows.data(), 100);
  EXPECT_EQ(m.rows(0), 100);
  EXPECT_EQ(m.rows(1), 99);
  std::vector<float> without(rows.begin(), rows.begin() + 100 * kWidth);
  without.erase(without.begin() + 5 * kWidth, without.begin() + 6 * kWidth);
  auto fitted = m.Fit(TransformKind::kPca);
  auto expected = FitTransform(TransformKind::kPca, without.data(), 99, kHeads, kDim);
  ASSERT_TRUE(fitted.ok() && expected.ok());
  for (int64_t i = 0; i < kDim; ++i) {
    EXPECT_NEAR(fitted->head[1].mean[i], expected->head[1].mean[i], 1e-5);
  }
  // Too few rows, and a Hadamard of a dim that is not a power of two.
  TransformMoments one(kHeads, kDim);
  one.Add(s.rows.data(), 1);
  EXPECT_EQ(one.Fit(TransformKind::kPca).status().code(), absl::StatusCode::kInvalidArgument);
  TransformMoments odd(1, 6);
  odd.Add(s.rows.data(), 10);
  EXPECT_THAT(std::string(odd.Fit(TransformKind::kHadamard).status().message()),
              HasSubstr("power-of-two"));
}

}  // namespace
}  // namespace riskkv
