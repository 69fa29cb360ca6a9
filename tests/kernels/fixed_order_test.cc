// The fixed-order float kernels: every blocked or fused form gives exactly the bits of its
// one-output definition, whatever the block shape, and stays close to a double-precision sum.
#include "kernels/cpu/fixed_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/dtype.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

using testing::QuantizeRow;
using testing::RandomVector;

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// DotF32 written out as its definition: eight lanes of fused multiply-adds in index order, the
// horizontal sum ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the tail fused in order.
float DotDefinition(const float* a, const float* b, int64_t n) {
  float lane[8] = {};
  const int64_t n8 = n - n % 8;
  for (int64_t k = 0; k < n8; k += 8) {
    for (int l = 0; l < 8; ++l) lane[l] = std::fmaf(a[k + l], b[k + l], lane[l]);
  }
  float s =
      ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (int64_t k = n8; k < n; ++k) s = std::fmaf(a[k], b[k], s);
  return s;
}

TEST(FixedOrder, DotF32IsItsDefinitionAndCloseToExact) {
  for (int64_t n : {1, 7, 8, 9, 64, 100, 576, 1537}) {
    const auto a = RandomVector(n, 1);
    const auto b = RandomVector(n, 2);
    double exact = 0.0;
    double magnitude = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      exact += static_cast<double>(a[k]) * b[k];
      magnitude += std::fabs(static_cast<double>(a[k]) * b[k]);
    }
    const float got = cpu::DotF32(a.data(), b.data(), n);
    EXPECT_TRUE(SameBits(got, DotDefinition(a.data(), b.data(), n))) << "n=" << n;
    EXPECT_NEAR(got, exact, 1e-6 * magnitude + 1e-30) << "n=" << n;
  }
}

TEST(FixedOrder, DotTileEqualsDotF32ForEveryBlockShape) {
  for (int64_t n : {5, 64, 72}) {
    for (int64_t rows : {1, 2, 3, 7, 9, 17}) {
      for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 9}) {
        const int64_t w_stride = n + 3, x_stride = n + 5, y_stride = rows + 2;
        const auto w = RandomVector(rows * w_stride, 3);
        const auto x = RandomVector(tokens * x_stride, 4);
        std::vector<float> y(tokens * y_stride, -1.0f);
        cpu::DotTile(w.data(), w_stride, rows, x.data(), x_stride, tokens, n, y.data(), y_stride);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_TRUE(SameBits(y[t * y_stride + r],
                                 cpu::DotF32(w.data() + r * w_stride, x.data() + t * x_stride, n)))
                << "n=" << n << " rows=" << rows << " tokens=" << tokens << " t=" << t
                << " r=" << r;
          }
          EXPECT_EQ(y[t * y_stride + rows], -1.0f) << "wrote past the rows";
        }
      }
    }
  }
}

// The AVX-512 tile (two rows a vector) gives DotF32's bits for every block shape: row pairs in
// fours and alone, tokens in fours and the remainders.
TEST(FixedOrder, DotPairTileEqualsDotF32ForEveryBlockShape) {
  if (!cpu::PairTileSupported()) GTEST_SKIP() << "this CPU lacks AVX-512";
  for (int64_t n : {8, 64, 576}) {
    for (int64_t rows : {2, 4, 6, 8, 10, 18}) {
      for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 9}) {
        const int64_t x_stride = n + 5, y_stride = rows + 2;
        const auto w = RandomVector(rows * n, 5);
        const auto x = RandomVector(tokens * x_stride, 6);
        std::vector<float> pairs(rows * n, 0.0f), y(tokens * y_stride, -1.0f);
        cpu::InterleavePairs(w.data(), rows, n, pairs.data());
        cpu::DotPairTile(pairs.data(), rows, x.data(), x_stride, tokens, n, y.data(), y_stride);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_TRUE(SameBits(y[t * y_stride + r],
                                 cpu::DotF32(w.data() + r * n, x.data() + t * x_stride, n)))
                << "n=" << n << " rows=" << rows << " tokens=" << tokens << " t=" << t
                << " r=" << r;
          }
          EXPECT_EQ(y[t * y_stride + rows], -1.0f) << "wrote past the rows";
        }
      }
    }
  }
}

// f16 rows, as attention reads an f16 cache: the bits of DotF32 over the rows converted to f32.
TEST(FixedOrder, DotTileF16EqualsDotF32OfTheConvertedRows) {
  for (int64_t n : {5, 64, 72}) {
    for (int64_t rows : {1, 2, 3, 7, 9, 17}) {
      for (int64_t tokens : {1, 2, 3, 4, 5, 7}) {
        const int64_t w_stride = n + 3, x_stride = n + 5, y_stride = rows + 2;
        const auto w32 = RandomVector(rows * w_stride, 13);
        std::vector<uint16_t> w(w32.size());
        F32ToF16Row(w32.data(), w.data(), static_cast<int64_t>(w.size()));
        std::vector<float> converted(w.size());
        F16ToF32Row(w.data(), converted.data(), static_cast<int64_t>(w.size()));
        const auto x = RandomVector(tokens * x_stride, 14);
        std::vector<float> y(tokens * y_stride, -1.0f);
        cpu::DotTileF16(w.data(), w_stride, rows, x.data(), x_stride, tokens, n, y.data(),
                        y_stride);
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_TRUE(SameBits(y[t * y_stride + r], cpu::DotF32(converted.data() + r * w_stride,
                                                                  x.data() + t * x_stride, n)))
                << "n=" << n << " rows=" << rows << " tokens=" << tokens << " t=" << t
                << " r=" << r;
          }
          EXPECT_EQ(y[t * y_stride + rows], -1.0f) << "wrote past the rows";
        }
      }
    }
  }
}

class DotDequantizedTest : public ::testing::TestWithParam<DType> {};

TEST_P(DotDequantizedTest, EqualsDotF32OfTheDequantizedRow) {
  const DType t = GetParam();
  // Three blocks of 32 (two K-quant super-blocks); float rows also get a tail.
  const int64_t n = BlockSize(t) > 32 ? 512 : 96;
  for (int64_t cols : {n, t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 ? n + 5 : n}) {
    const int64_t rows = 7;
    const auto values = RandomVector(rows * cols, 5, 0.7f);
    std::vector<uint8_t> bytes;
    for (int64_t r = 0; r < rows; ++r) {
      const auto q = QuantizeRow(t, values.data() + r * cols, cols);
      bytes.insert(bytes.end(), q.begin(), q.end());
    }
    const int64_t row_bytes = RowBytes(t, cols);
    std::vector<float> dequantized(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(t, bytes.data() + r * row_bytes, dequantized.data() + r * cols, cols);
    }
    for (int tokens = 1; tokens <= 4; ++tokens) {
      const auto x = RandomVector(tokens * cols, 6);
      std::vector<float> y(tokens * rows);
      cpu::DotDequantizedRows(t, bytes.data(), row_bytes, rows, x.data(), cols, tokens, cols,
                              y.data(), rows);
      for (int i = 0; i < tokens; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          ASSERT_TRUE(SameBits(y[i * rows + r], cpu::DotF32(dequantized.data() + r * cols,
                                                            x.data() + i * cols, cols)))
              << DTypeName(t) << " cols=" << cols << " tokens=" << tokens << " row " << r;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DotDequantizedTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                           DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                           DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(FixedOrder, WeightedRowsAccumulatesEachOutputInRowOrder) {
  for (int64_t width : {8, 16, 64, 70, 3}) {
    for (int64_t tokens : {1, 2, 3, 4, 5, 9}) {
      const int64_t count = 6;  // query t sees count + t rows
      const int64_t p_stride = count + tokens + 1, v_stride = width + 4, out_stride = width + 3;
      const auto p = RandomVector(tokens * p_stride, 7);
      const auto v = RandomVector((count + tokens) * v_stride, 8);
      std::vector<float> out(tokens * out_stride, -1.0f);
      cpu::WeightedRows(p.data(), p_stride, tokens, count, v.data(), v_stride, width, out.data(),
                        out_stride);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t d = 0; d < width; ++d) {
          float s = 0.0f;
          for (int64_t j = 0; j < count + t; ++j) {
            s = std::fmaf(p[t * p_stride + j], v[j * v_stride + d], s);
          }
          ASSERT_TRUE(SameBits(out[t * out_stride + d], s))
              << "width=" << width << " tokens=" << tokens << " t=" << t << " d=" << d;
        }
        EXPECT_EQ(out[t * out_stride + width], -1.0f) << "wrote past the width";
      }
    }
  }
}

// The shared-count form (query heads of one query), from f32 and from f16 values: each output
// accumulated in row order from zero over the same `count` rows, the f16 values converted first.
TEST(FixedOrder, WeightedRowsSharedAccumulatesEveryTokenOverTheSameRows) {
  for (int64_t width : {8, 16, 64, 70, 3}) {
    for (int64_t tokens : {1, 2, 3, 4, 5, 9}) {
      const int64_t count = 11;
      const int64_t p_stride = count + 2, v_stride = width + 4, out_stride = width + 3;
      const auto p = RandomVector(tokens * p_stride, 17);
      const auto v32 = RandomVector(count * v_stride, 18);
      std::vector<uint16_t> v16(v32.size());
      F32ToF16Row(v32.data(), v16.data(), static_cast<int64_t>(v16.size()));
      std::vector<float> converted(v16.size());
      F16ToF32Row(v16.data(), converted.data(), static_cast<int64_t>(v16.size()));
      for (const bool half : {false, true}) {
        const std::vector<float>& v = half ? converted : v32;
        std::vector<float> out(tokens * out_stride, -1.0f);
        if (half) {
          cpu::WeightedRowsSharedF16(p.data(), p_stride, tokens, count, v16.data(), v_stride, width,
                                     out.data(), out_stride);
        } else {
          cpu::WeightedRowsShared(p.data(), p_stride, tokens, count, v32.data(), v_stride, width,
                                  out.data(), out_stride);
        }
        for (int64_t t = 0; t < tokens; ++t) {
          for (int64_t d = 0; d < width; ++d) {
            float s = 0.0f;
            for (int64_t j = 0; j < count; ++j) {
              s = std::fmaf(p[t * p_stride + j], v[j * v_stride + d], s);
            }
            ASSERT_TRUE(SameBits(out[t * out_stride + d], s))
                << "f16=" << half << " width=" << width << " tokens=" << tokens << " t=" << t
                << " d=" << d;
          }
          EXPECT_EQ(out[t * out_stride + width], -1.0f) << "wrote past the width";
        }
      }
    }
  }
}

float ExpOf(float x) {
  alignas(32) float out[8];
  _mm256_store_ps(out, cpu::Exp8(_mm256_set1_ps(x)));
  return out[0];
}

constexpr double kPositiveZero = 0.0;

double ExpOf(double x) {
  alignas(32) double out[4];
  _mm256_store_pd(out, cpu::Exp4(_mm256_set1_pd(x)));
  return out[0];
}

// The vector exps are glibc's: within 4 ulp of the exact value (checked against long double
// over the ranges the kernels feed them), and a lane's result does not depend on its neighbours.
TEST(FixedOrder, VectorExpIsAccurateAndLaneIndependent) {
  auto x = RandomVector(4096, 31);
  const float amax = std::fabs(*std::max_element(
      x.begin(), x.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }));
  for (float& v : x) v /= amax;  // within [-1, 1]
  for (size_t i = 0; i < x.size(); ++i) {
    const float xf = x[i] * 80.0f;  // normal results
    const long double exact = std::exp(static_cast<long double>(xf));
    const float got = ExpOf(xf);
    EXPECT_LE(std::fabs(static_cast<long double>(got) - exact) / exact,
              4 * std::numeric_limits<float>::epsilon())
        << "x=" << xf;
    const double xd = static_cast<double>(x[i]) * 700.0;
    const long double exact_d = std::exp(static_cast<long double>(xd));
    EXPECT_LE(std::fabs(static_cast<long double>(ExpOf(xd)) - exact_d) / exact_d,
              4 * std::numeric_limits<double>::epsilon())
        << "x=" << xd;
  }
  // Lanes that take glibc's special-case path (underflow, overflow, NaN) beside ordinary ones.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float in[8] = {-1, -100, 1, 100, -50, nan, -0.5f, 10};
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, cpu::Exp8(_mm256_loadu_ps(in)));
  for (int l = 0; l < 8; ++l) EXPECT_TRUE(SameBits(lanes[l], ExpOf(in[l]))) << "lane " << l;
  EXPECT_EQ(lanes[3], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(lanes[5]));
  const double in_d[4] = {-800, 1, nan, 800};
  alignas(32) double lanes_d[4];
  _mm256_store_pd(lanes_d, cpu::Exp4(_mm256_loadu_pd(in_d)));
  for (int l = 0; l < 4; ++l) {
    const double want = ExpOf(in_d[l]);
    EXPECT_EQ(std::memcmp(&lanes_d[l], &want, sizeof(double)), 0) << "lane " << l;
  }
  EXPECT_EQ(ExpOf(0.0f), 1.0f);
  // The softmax and log-sum-exp pad a row's last eight values with -inf: each must add +0.
  EXPECT_TRUE(SameBits(ExpOf(-std::numeric_limits<float>::infinity()), 0.0f));
  const double zero = ExpOf(-std::numeric_limits<double>::infinity());
  EXPECT_EQ(std::memcmp(&zero, &kPositiveZero, sizeof(double)), 0);
}

// Softmax is its definition: the max and the scaling are exact in any order; each exp is the
// vector exp of its own value, added to lane j % 8 in index order, the lanes summed in
// HorizontalSum's order. Lengths around the eight-lane step; and close to a double softmax.
TEST(FixedOrder, SoftmaxIsItsDefinition) {
  for (int64_t n : {1, 7, 8, 9, 17, 300}) {
    const float scale = 0.125f;
    auto s = RandomVector(n, 21);
    for (float& x : s) x *= 20.0f;
    std::vector<float> want = s;
    float mx = -INFINITY;
    for (float& x : want) {
      x *= scale;
      mx = std::max(mx, x);
    }
    float lane[8] = {};
    for (int64_t j = 0; j < n; ++j) {
      want[j] = ExpOf(want[j] - mx);
      lane[j % 8] = lane[j % 8] + want[j];
    }
    const float sum =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    const float inv = 1.0f / sum;
    for (float& x : want) x *= inv;
    std::vector<double> exact(n);
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) total += exact[j] = std::exp(double{s[j]} * scale - mx);
    cpu::Softmax(s.data(), n, scale);
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_TRUE(SameBits(s[j], want[j])) << "n=" << n << " j=" << j;
      EXPECT_NEAR(s[j], exact[j] / total, 1e-6 * exact[j] / total + 1e-12) << "n=" << n;
    }
  }
}

// SwiGluRow is its per-element definition whatever the length and offset of the slice it is
// given (a thread's chunk), and close to the double-precision value.
TEST(FixedOrder, SwiGluRowIsPerElement) {
  constexpr int64_t kN = 77;
  auto gate = RandomVector(kN, 41), up = RandomVector(kN, 42);
  for (float& g : gate) g *= 30.0f;
  std::vector<float> whole(kN), pieces(kN);
  cpu::SwiGluRow(gate.data(), up.data(), kN, whole.data());
  for (int64_t begin = 0; begin < kN; begin += 13) {
    const int64_t end = std::min(kN, begin + 13);
    cpu::SwiGluRow(gate.data() + begin, up.data() + begin, end - begin, pieces.data() + begin);
  }
  for (int64_t i = 0; i < kN; ++i) {
    const float g = gate[i];
    const float want = g / (1.0f + ExpOf(-g)) * up[i];
    ASSERT_TRUE(SameBits(whole[i], want)) << "i=" << i;
    ASSERT_TRUE(SameBits(pieces[i], want)) << "i=" << i;
    const double exact = g / (1.0 + std::exp(-double{g})) * up[i];
    EXPECT_NEAR(whole[i], exact, 1e-6 * std::fabs(exact) + 1e-30) << "i=" << i;
  }
}

// LogSumExp is its definition (double exps of x - max, lane j % 8 in index order, the fixed
// lane sum) and within 1e-12 of a long double log-sum-exp, for lengths around the eight-lane
// step and a vocabulary-sized row.
TEST(FixedOrder, LogSumExpIsItsDefinition) {
  for (int64_t n : {1, 3, 8, 13, 49152}) {
    auto x = RandomVector(n, 51);
    for (float& v : x) v *= 15.0f;
    const float mx = *std::max_element(x.begin(), x.end());
    double lane[8] = {};
    long double exact = 0.0L;
    for (int64_t j = 0; j < n; ++j) {
      lane[j % 8] = lane[j % 8] + ExpOf(static_cast<double>(x[j]) - mx);
      exact += std::exp(static_cast<long double>(x[j]) - mx);
    }
    const double sum =
        ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
    const double got = cpu::LogSumExp(x.data(), n);
    EXPECT_EQ(got, std::log(sum) + mx) << "n=" << n;
    EXPECT_NEAR(got, static_cast<double>(std::log(exact) + mx), 1e-12 * std::fabs(got) + 1e-12)
        << "n=" << n;
  }
}

}  // namespace
}  // namespace riskkv
