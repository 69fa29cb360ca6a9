// The 8-bit-activation block dots (kernels/cpu/quant_dot.h) against a scalar restatement of their
// arithmetic: one exact integer dot per 32-value block, converted and fused into the output's
// accumulator with the block's scale in block order, then (Q4_1) the offsets summed block by
// block and added. Outputs must match bit for bit, for every number of rows and tokens a call
// takes, whichever integer dot instruction the build uses (quant_dot_avx2_test builds it for
// AVX2 alone).
#include "kernels/cpu/quant_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/dtype.h"
#include "tests/kernels/op_reference.h"

namespace riskkv::cpu {
namespace {

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block, as ggml packs them.
void ScaleMin(int j, const uint8_t* s, int* sc, int* m) {
  *sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
  *m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
}

// Block b (32 values) of `row` as the arithmetic reads it: the integer weights w (codes less
// their zero point), the integer scale of each value (1 but for Q6_K's sub-block scales), the
// float scale d and the offset m (0 where the type has none).
void BlockWeights(DType t, const uint8_t* row, int64_t b, int w[32], int scale[32], float* d,
                  float* m) {
  *m = 0.0f;
  for (int j = 0; j < 32; ++j) scale[j] = 1;
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool q4_1 = t == DType::kQ4_1;
      const uint8_t* blk = row + b * (q4_1 ? 20 : 18);
      *d = testing::GetHalf(blk);
      if (q4_1) *m = testing::GetHalf(blk + 2);
      const uint8_t* qs = blk + (q4_1 ? 4 : 2);
      for (int j = 0; j < 16; ++j) {
        w[j] = (qs[j] & 0x0f) - (q4_1 ? 0 : 8);
        w[j + 16] = (qs[j] >> 4) - (q4_1 ? 0 : 8);
      }
      return;
    }
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool q5_1 = t == DType::kQ5_1;
      const uint8_t* blk = row + b * (q5_1 ? 24 : 22);
      *d = testing::GetHalf(blk);
      if (q5_1) *m = testing::GetHalf(blk + 2);
      const uint8_t* qh = blk + (q5_1 ? 4 : 2);
      const uint8_t* qs = qh + 4;
      for (int j = 0; j < 32; ++j) {
        const int nibble = j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
        const int fifth = (qh[j / 8] >> (j % 8)) & 1;
        w[j] = (nibble | fifth << 4) - (q5_1 ? 0 : 16);
      }
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool q5 = t == DType::kQ5_K;
      const uint8_t* sb = row + b / 8 * (q5 ? 176 : 144);
      const int sub = static_cast<int>(b % 8);
      int sc, mn;
      ScaleMin(sub, sb + 4, &sc, &mn);
      *d = testing::GetHalf(sb) * static_cast<float>(sc);
      *m = -(testing::GetHalf(sb + 2) * static_cast<float>(mn));
      const uint8_t* qs = sb + (q5 ? 48 : 16) + sub / 2 * 32;
      for (int j = 0; j < 32; ++j) {
        w[j] = (qs[j] >> (4 * (sub % 2))) & 0x0f;
        if (q5) w[j] |= ((sb[16 + j] >> sub) & 1) << 4;
      }
      return;
    }
    case DType::kQ6_K: {
      // ggml's dequantize_row_q6_K: value 32 * sub + l of the super-block.
      const uint8_t* sb = row + b / 8 * 210;
      const int sub = static_cast<int>(b % 8), half = sub / 4, quarter = sub % 4;
      const uint8_t* ql = sb + 64 * half;
      const uint8_t* qh = sb + 128 + 32 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(sb + 192) + 8 * half;
      *d = testing::GetHalf(sb + 208);
      for (int l = 0; l < 32; ++l) {
        const int low = quarter == 0   ? ql[l] & 0x0f
                        : quarter == 1 ? ql[l + 32] & 0x0f
                        : quarter == 2 ? ql[l] >> 4
                                       : ql[l + 32] >> 4;
        w[l] = (low | ((qh[l] >> (2 * quarter)) & 3) << 4) - 32;
        scale[l] = sc[l / 16 + 2 * quarter];
      }
      return;
    }
    default: {
      const uint8_t* blk = row + b * 34;
      *d = testing::GetHalf(blk);
      for (int j = 0; j < 32; ++j) w[j] = static_cast<int8_t>(blk[2 + j]);
    }
  }
}

bool TypeHasOffset(DType t) {
  return t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K;
}

// DotRowsQ8's definition: per block, the exact integer dot of its 32 products, converted and
// fused into one accumulator with the block's scale; the offsets summed apart and added last.
float Reference(DType t, const uint8_t* row, const Q8Block* x, int64_t n) {
  float acc = 0.0f, offset = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    int w[32], scale[32];
    float d, m;
    BlockWeights(t, row, b, w, scale, &d, &m);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += scale[j] * w[j] * x[b].q[j];
    const float block_scale = d * x[b].d;
    acc = std::fma(block_scale, static_cast<float>(sum), acc);
    const float term = m * x[b].s;
    offset = offset + term;
  }
  return TypeHasOffset(t) ? acc + offset : acc;
}

// Every quantized type, and the widths a type allows among 32, 576 and 1536.
std::vector<std::tuple<DType, int64_t>> TypesAndWidths() {
  std::vector<std::tuple<DType, int64_t>> out;
  for (const DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0,
                        DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (const int64_t n : {32, 256, 576, 1536}) {
      if (n % BlockSize(t) == 0 && (n != 256 || BlockSize(t) == 256)) out.emplace_back(t, n);
    }
  }
  return out;
}

class DotRowsQ8Test : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(DotRowsQ8Test, MatchesScalarArithmeticBitForBit) {
  const auto [dtype, n] = GetParam();
  constexpr int kRows = kDotRowsQ8 + 1, kTokens = 4;
  const auto values = testing::RandomVector(kRows * n, 7, 0.05f);
  std::vector<uint8_t> rows;
  for (int r = 0; r < kRows; ++r) {
    const auto q = testing::QuantizeRow(dtype, values.data() + r * n, n);
    rows.insert(rows.end(), q.begin(), q.end());
  }
  const int64_t row_bytes = RowBytes(dtype, n);
  const auto x = testing::RandomVector(kTokens * n, 8);
  std::vector<Q8Block> xq(kTokens * n / 32);
  for (int t = 0; t < kTokens; ++t) QuantizeQ8(x.data() + t * n, n, xq.data() + t * n / 32);
  for (int n_rows = 1; n_rows <= kDotRowsQ8; ++n_rows) {
    for (int count = 1; count <= kTokens; ++count) {
      std::vector<float> out(n_rows * count);
      DotRowsQ8(dtype, rows.data() + row_bytes, row_bytes, n_rows, xq.data(), n / 32, count, n,
                out.data());
      for (int r = 0; r < n_rows; ++r) {
        for (int t = 0; t < count; ++t) {
          const float want =
              Reference(dtype, rows.data() + (r + 1) * row_bytes, xq.data() + t * n / 32, n);
          EXPECT_EQ(out[r * count + t], want)
              << DTypeName(dtype) << " n=" << n << " rows=" << n_rows << " tokens=" << count
              << " row " << r << " token " << t;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DotRowsQ8Test, ::testing::ValuesIn(TypesAndWidths()));

// The largest products the formats allow: Q8_0 weights of -128 (whose magnitude only fits an
// unsigned byte), Q4_1 weights of 15 and Q4_0 weights of -8, against activations of +127 and of
// -127 in every position, where a pair of products comes nearest the int16 range of AVX2's
// pairwise sums (2 * 128 * 127 = 32512 for Q8_0).
TEST(DotRowsQ8, ExtremeCodesStayExact) {
  for (const DType dtype : {DType::kQ8_0, DType::kQ4_1, DType::kQ4_0}) {
    const int64_t block = dtype == DType::kQ4_1 ? 20 : dtype == DType::kQ4_0 ? 18 : 34;
    std::vector<uint8_t> row(block, 0);
    row[0] = 0x00;  // d = 1.0 (f16 0x3c00); Q4_1's min stays 0
    row[1] = 0x3c;
    for (int64_t i = dtype == DType::kQ4_1 ? 4 : 2; i < block; ++i) {
      row[i] = dtype == DType::kQ8_0 ? 0x80 : dtype == DType::kQ4_1 ? 0xff : 0x00;
    }
    const int w = dtype == DType::kQ8_0 ? -128 : dtype == DType::kQ4_1 ? 15 : -8;
    for (const int q : {127, -127}) {
      Q8Block x{.d = 1.0f, .s = 0.0f, .sum = 32 * q, .sum_lo = 16 * q, .q = {}};
      for (int j = 0; j < 32; ++j) x.q[j] = static_cast<int8_t>(q);
      float out = 0;
      DotRowsQ8(dtype, row.data(), block, 1, &x, 1, 1, 32, &out);
      EXPECT_EQ(out, static_cast<float>(w * q * 32)) << DTypeName(dtype) << " q=" << q;
      EXPECT_EQ(out, Reference(dtype, row.data(), &x, 32)) << DTypeName(dtype) << " q=" << q;
    }
  }
}

// The arithmetic reads the weights DequantizeRow reads: on random rows of every type, each
// output is the product of the dequantized row and the dequantized activations within the
// rounding of the scales (relative 1e-4 of the sum of magnitudes).
TEST(DotRowsQ8, AgreesWithTheDequantizedProduct) {
  for (const auto& [dtype, n] : TypesAndWidths()) {
    const std::vector<uint8_t> row = testing::RandomBlocks(dtype, 1, n, 41);
    std::vector<float> w(n);
    DequantizeRow(dtype, row.data(), w.data(), n);
    const auto x = testing::RandomVector(n, 42);
    std::vector<Q8Block> xq(n / 32);
    QuantizeQ8(x.data(), n, xq.data());
    double want = 0.0, magnitude = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double a = static_cast<double>(xq[i / 32].d) * xq[i / 32].q[i % 32];
      want += w[i] * a;
      magnitude += std::fabs(w[i] * a);
    }
    float got = 0.0f;
    DotRowsQ8(dtype, row.data(), RowBytes(dtype, n), 1, xq.data(), n / 32, 1, n, &got);
    EXPECT_NEAR(got, want, 1e-4 * magnitude) << DTypeName(dtype) << " n=" << n;
  }
}

// Rows of random bytes (every code, sub-block scale and min of each type) against activations
// of random codes and of +127 and -127 throughout, including Q6_K's halves of opposite signs.
TEST(DotRowsQ8, EveryCodeOfEveryTypeMatchesScalarArithmetic) {
  for (const auto& [dtype, n] : TypesAndWidths()) {
    const std::vector<uint8_t> rows = testing::RandomBlocks(dtype, kDotRowsQ8, n, 31);
    const int64_t row_bytes = RowBytes(dtype, n), blocks = n / 32;
    constexpr int kTokens = 4;
    const auto x = testing::RandomVector(kTokens * n, 32);
    std::vector<Q8Block> xq(kTokens * blocks);
    for (int t = 0; t < kTokens; ++t) QuantizeQ8(x.data() + t * n, n, xq.data() + t * blocks);
    for (int64_t i = blocks; i < 3 * blocks; ++i) {  // tokens 1 and 2: saturated codes
      int sum = 0, sum_lo = 0;
      for (int j = 0; j < 32; ++j) {
        const int q = (i < 2 * blocks) == (j < 16) ? 127 : -127;
        xq[i].q[j] = static_cast<int8_t>(i % 2 ? q : 127);
        sum += xq[i].q[j];
        if (j < 16) sum_lo += xq[i].q[j];
      }
      xq[i].sum = sum;
      xq[i].sum_lo = sum_lo;
    }
    std::vector<float> out(kDotRowsQ8 * kTokens);
    DotRowsQ8(dtype, rows.data(), row_bytes, kDotRowsQ8, xq.data(), blocks, kTokens, n, out.data());
    for (int r = 0; r < kDotRowsQ8; ++r) {
      for (int t = 0; t < kTokens; ++t) {
        EXPECT_EQ(out[r * kTokens + t],
                  Reference(dtype, rows.data() + r * row_bytes, xq.data() + t * blocks, n))
            << DTypeName(dtype) << " n=" << n << " row " << r << " token " << t;
      }
    }
  }
}

}  // namespace
}  // namespace riskkv::cpu
