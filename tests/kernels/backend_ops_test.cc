// Every backend op against a naive double-precision reference, over shapes and dtypes, compared
// by normalised mean squared error with a per-op tolerance (after ggml's test-backend-ops).
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "kernels/backend.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

using testing::GetHalf;
using testing::Nmse;
using testing::QuantizeRow;
using testing::RandomVector;

std::vector<std::unique_ptr<Backend>> Backends() {
  std::vector<std::unique_ptr<Backend>> out;
  out.push_back(MakeCpuBackend(1));
  out.push_back(MakeCpuBackend(2));
  return out;
}

struct QuantizedMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;  // what the kernel should compute with
  WeightMatrix view;
};

QuantizedMatrix MakeMatrix(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  QuantizedMatrix m;
  const auto x = RandomVector(rows * cols, seed, 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = QuantizeRow(t, x.data() + r * cols, cols);
    m.bytes.insert(m.bytes.end(), q.begin(), q.end());
  }
  m.dequantized.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeRow(t, m.bytes.data() + r * RowBytes(t, cols), m.dequantized.data() + r * cols, cols);
  }
  m.view = {t, m.bytes.data(), rows, cols};
  return m;
}

class MatMulTest : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};

TEST_P(MatMulTest, MatchesReference) {
  const auto [dtype, n, rows, cols] = GetParam();
  const QuantizedMatrix w = MakeMatrix(dtype, rows, cols, 11);
  const auto x = RandomVector(n * cols, 12);
  const auto bias = RandomVector(rows, 13);
  std::vector<double> ref(n * rows);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double s = bias[r];
      for (int64_t j = 0; j < cols; ++j)
        s += static_cast<double>(w.dequantized[r * cols + j]) * x[i * cols + j];
      ref[i * rows + r] = s;
    }
  }
  std::vector<float> reff(ref.begin(), ref.end());
  for (auto& be : Backends()) {
    std::vector<float> y(n * rows);
    be->MatMul(x.data(), n, w.view, bias.data(), y.data());
    EXPECT_LT(Nmse(y.data(), reff.data(), n * rows), 1e-10)
        << be->name() << " threads=" << be->threads() << " " << DTypeName(dtype) << " n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatMulTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                         DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1),
                       ::testing::Values<int64_t>(1, 3, 5, 70),  // fused and tiled paths
                       ::testing::Values<int64_t>(1, 67, 130),   // partial tiles
                       ::testing::Values<int64_t>(64, 96)));

// K-quant rows are whole super-blocks of 256.
INSTANTIATE_TEST_SUITE_P(
    KQuants, MatMulTest,
    ::testing::Combine(::testing::Values(DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                       ::testing::Values<int64_t>(1, 3, 5, 70), ::testing::Values<int64_t>(1, 67),
                       ::testing::Values<int64_t>(256, 512)));

// Float weights take any width: odd and short rows exercise the SIMD dot products' tails.
INSTANTIATE_TEST_SUITE_P(
    FloatOddCols, MatMulTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values<int64_t>(1, 3, 5, 70),  // fused and tiled paths
                       ::testing::Values<int64_t>(1, 67), ::testing::Values<int64_t>(1, 7, 100)));

// The offset a block's values share (dequantized value = scale * code + offset), for the types
// whose 8-bit products add it apart: Q4_1 and Q5_1's m, Q4_K and Q5_K's -(dmin * m_j).
double BlockOffset(DType t, const uint8_t* row, int64_t b) {
  switch (t) {
    case DType::kQ4_1:
      return GetHalf(row + b * 20 + 2);
    case DType::kQ5_1:
      return GetHalf(row + b * 24 + 2);
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const uint8_t* sb = row + b / 8 * (t == DType::kQ4_K ? 144 : 176);
      int sc, m;
      KQuantScaleMin(static_cast<int>(b % 8), sb + 4, &sc, &m);
      return -static_cast<double>(GetHalf(sb + 2)) * m;
    }
    default:
      return 0.0;
  }
}

// The 8-bit activation path against an integer reference written from ggml's definitions:
// x quantized per block of 32 with d = amax / 127 (through f16), q = round-half-even(x / d);
// the types with an offset add it as m * f16(d * sum(q)) with d before its f16 rounding.
class MatMulInt8Test : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(MatMulInt8Test, MatchesIntegerReference) {
  const auto [dtype, n] = GetParam();
  const int64_t rows = 75, cols = 256;
  const QuantizedMatrix w = MakeMatrix(dtype, rows, cols, 21);
  const auto x = RandomVector(n * cols, 22);
  std::vector<float> ref(n * rows), exact(n * rows);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double sum = 0, sum_exact = 0;
      for (int64_t b = 0; b < cols / 32; ++b) {
        const float* xb = x.data() + i * cols + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const double dx = F16ToF32(F32ToF16(amax / 127.0f));
        long qsum = 0;
        double dot = 0;  // sum of dequantized-weight * integer activation
        for (int j = 0; j < 32; ++j) {
          const long q = std::lrint(xb[j] * (127.0f / amax));
          qsum += q;
          dot += static_cast<double>(w.dequantized[r * cols + b * 32 + j]) * q;
          sum_exact += static_cast<double>(w.dequantized[r * cols + b * 32 + j]) * xb[j];
        }
        // The offset's share goes as m * f16(d * sum(q)); the rest is d * sum(qw * qx).
        const double m = BlockOffset(dtype, w.bytes.data() + r * RowBytes(dtype, cols), b);
        sum += (dot - m * static_cast<double>(qsum)) * dx +
               m * F16ToF32(F32ToF16(amax / 127.0f * static_cast<float>(qsum)));
      }
      ref[i * rows + r] = static_cast<float>(sum);
      exact[i * rows + r] = static_cast<float>(sum_exact);
    }
  }
  auto be = MakeCpuBackend(2, ActivationPrecision::kInt8);
  EXPECT_EQ(be->activation_precision(), ActivationPrecision::kInt8);
  std::vector<float> y(n * rows);
  be->MatMul(x.data(), n, w.view, nullptr, y.data());
  EXPECT_LT(Nmse(y.data(), ref.data(), y.size()), 1e-9) << DTypeName(dtype) << " n=" << n;
  // And within activation-rounding distance of the exact product.
  EXPECT_LT(Nmse(y.data(), exact.data(), y.size()), 1e-3) << DTypeName(dtype) << " n=" << n;
}

INSTANTIATE_TEST_SUITE_P(
    Types, MatMulInt8Test,
    ::testing::Combine(::testing::Values(DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                         DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                       ::testing::Values<int64_t>(1, 4, 70)));

TEST(BackendOps, Int8LeavesFloatWeightsExact) {
  const QuantizedMatrix w = MakeMatrix(DType::kF16, 33, 64, 31);
  const auto x = RandomVector(3 * 64, 32);
  std::vector<float> a(3 * 33), b(3 * 33);
  MakeCpuBackend(1, ActivationPrecision::kInt8)->MatMul(x.data(), 3, w.view, nullptr, a.data());
  MakeCpuBackend(1, ActivationPrecision::kF32)->MatMul(x.data(), 3, w.view, nullptr, b.data());
  EXPECT_EQ(a, b);
}

TEST(BackendOps, RmsNorm) {
  // 7 rows stay on the caller; 40 rows span several 16-row chunks of the pool.
  for (const int64_t n : {7, 40}) {
    const int64_t d = 96;
    const auto x = RandomVector(n * d, 1, 3.0f);
    const auto w = RandomVector(d, 2);
    std::vector<float> ref(n * d);
    for (int64_t i = 0; i < n; ++i) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[i * d + j]) * x[i * d + j];
      const double s = 1.0 / std::sqrt(ss / d + 1e-5);
      for (int64_t j = 0; j < d; ++j) ref[i * d + j] = static_cast<float>(x[i * d + j] * s * w[j]);
    }
    for (auto& be : Backends()) {
      std::vector<float> y(n * d);
      be->RmsNorm(x.data(), n, d, w.data(), 1e-5f, y.data());
      EXPECT_LT(Nmse(y.data(), ref.data(), n * d), 1e-12)
          << "threads=" << be->threads() << " n=" << n;
      std::vector<float> inplace = x;
      be->RmsNorm(inplace.data(), n, d, w.data(), 1e-5f, inplace.data());
      EXPECT_LT(Nmse(inplace.data(), ref.data(), n * d), 1e-12)
          << "threads=" << be->threads() << " n=" << n;
    }
  }
}

class RopeTest : public ::testing::TestWithParam<std::tuple<RopeLayout, int64_t>> {};

TEST_P(RopeTest, MatchesReferenceAndInverts) {
  const auto [layout, n] = GetParam();
  const int64_t heads = 3, hd = 16;
  const RopeParams p{10000.0, hd, hd, layout};
  std::vector<int32_t> pos = {0, 1, 7, 100, 4095};
  for (int64_t t = 5; t < n; ++t) pos.push_back(static_cast<int32_t>(37 * t % 5000));
  pos.resize(n);
  const auto x = RandomVector(n * heads * hd, 3);
  std::vector<float> ref(x);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double theta = pos[t] * std::pow(10000.0, -2.0 * i / hd);
        const int64_t a = layout == RopeLayout::kInterleaved ? 2 * i : i;
        const int64_t b = layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + hd / 2;
        const double x0 = x[(t * heads + h) * hd + a], x1 = x[(t * heads + h) * hd + b];
        ref[(t * heads + h) * hd + a] =
            static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
        ref[(t * heads + h) * hd + b] =
            static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
      }
    }
  }
  for (auto& be : Backends()) {
    std::vector<float> y(x);
    be->Rope(y.data(), n, heads, pos.data(), p, false);
    EXPECT_LT(Nmse(y.data(), ref.data(), y.size()), 1e-12) << "threads=" << be->threads();
    be->Rope(y.data(), n, heads, pos.data(), p, true);  // inverse RoPE returns to pre-RoPE
    EXPECT_LT(Nmse(y.data(), x.data(), y.size()), 1e-12) << "threads=" << be->threads();
  }
}

// 5 tokens stay on the caller; 40 span several 16-token chunks of the pool.
INSTANTIATE_TEST_SUITE_P(Layouts, RopeTest,
                         ::testing::Combine(::testing::Values(RopeLayout::kInterleaved,
                                                              RopeLayout::kHalf),
                                            ::testing::Values<int64_t>(5, 40)));

TEST(BackendOps, SwiGlu) {
  // 100 elements stay on the caller; 40000 span three 16384-element chunks of the pool.
  for (const int64_t n : {100, 40000}) {
    const auto g = RandomVector(n, 4, 2.0f), u = RandomVector(n, 5);
    std::vector<float> ref(n);
    for (int64_t i = 0; i < n; ++i) {
      ref[i] = static_cast<float>(g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i]);
    }
    for (auto& be : Backends()) {
      std::vector<float> y(n);
      be->SwiGlu(g.data(), u.data(), n, y.data());
      EXPECT_LT(Nmse(y.data(), ref.data(), n), 1e-12) << "threads=" << be->threads() << " n=" << n;
      std::vector<float> inplace = g;  // the model writes over the gate
      be->SwiGlu(inplace.data(), u.data(), n, inplace.data());
      EXPECT_LT(Nmse(inplace.data(), ref.data(), n), 1e-12)
          << "threads=" << be->threads() << " n=" << n;
    }
  }
}

TEST(BackendOps, Embed) {
  const QuantizedMatrix table = MakeMatrix(DType::kQ8_0, 50, 64, 6);
  const std::vector<int32_t> ids = {3, 0, 49, 3};
  for (auto& be : Backends()) {
    std::vector<float> e(ids.size() * 64);
    be->Embed(table.view, ids.data(), ids.size(), e.data());
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int j = 0; j < 64; ++j) ASSERT_EQ(e[i * 64 + j], table.dequantized[ids[i] * 64 + j]);
    }
  }
}

class AttentionTest
    : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, int64_t, DType>> {};

TEST_P(AttentionTest, MatchesReference) {
  const auto [n, q_pos0, n_heads, n_kv_heads, kv_dtype] = GetParam();
  const int64_t hd = 16, n_ctx = q_pos0 + n;
  const auto q = RandomVector(n * n_heads * hd, 7);
  auto k = RandomVector(n_ctx * n_kv_heads * hd, 8);
  auto v = RandomVector(n_ctx * n_kv_heads * hd, 9);
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  if (kv_dtype == DType::kF16) {  // the reference sees exactly the stored values
    F32ToF16Row(k.data(), k16.data(), k.size());
    F32ToF16Row(v.data(), v16.data(), v.size());
    F16ToF32Row(k16.data(), k.data(), k.size());
    F16ToF32Row(v16.data(), v.data(), v.size());
  }
  std::vector<float> ref(n * n_heads * hd);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t kvh = h / (n_heads / n_kv_heads);
      const int64_t visible = q_pos0 + i + 1;
      std::vector<double> s(visible);
      double mx = -1e300;
      for (int64_t t = 0; t < visible; ++t) {
        double dot = 0;
        for (int64_t j = 0; j < hd; ++j)
          dot += static_cast<double>(q[(i * n_heads + h) * hd + j]) *
                 k[(t * n_kv_heads + kvh) * hd + j];
        s[t] = dot / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (auto& e : s) sum += (e = std::exp(e - mx));
      for (int64_t j = 0; j < hd; ++j) {
        double o = 0;
        for (int64_t t = 0; t < visible; ++t) o += s[t] / sum * v[(t * n_kv_heads + kvh) * hd + j];
        ref[(i * n_heads + h) * hd + j] = static_cast<float>(o);
      }
    }
  }
  const KvView kv_k{
      kv_dtype, kv_dtype == DType::kF16 ? static_cast<const void*>(k16.data()) : k.data(), n_ctx};
  const KvView kv_v{
      kv_dtype, kv_dtype == DType::kF16 ? static_cast<const void*>(v16.data()) : v.data(), n_ctx};
  for (auto& be : Backends()) {
    std::vector<float> out(n * n_heads * hd);
    be->Attention(q.data(), n, q_pos0, kv_k, kv_v, n_heads, n_kv_heads, hd, out.data());
    EXPECT_LT(Nmse(out.data(), ref.data(), out.size()), 1e-10) << "threads=" << be->threads();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(std::make_tuple(1, 0, 4, 2, DType::kF32),    // first decode step
                      std::make_tuple(1, 37, 9, 3, DType::kF32),   // decode with history, GQA 3:1
                      std::make_tuple(20, 0, 4, 4, DType::kF32),   // prefill, no GQA
                      std::make_tuple(300, 5, 4, 2, DType::kF32),  // several query blocks
                      std::make_tuple(17, 40, 6, 2, DType::kF16),  // f16 cache
                      std::make_tuple(1, 200, 4, 1, DType::kF16)));

}  // namespace
}  // namespace riskkv
