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

// Weights of block b of `row` as integers, its scale and (Q4_1) its min.
void BlockWeights(DType t, const uint8_t* row, int64_t b, int w[32], float* d, float* m) {
  *m = 0.0f;
  if (t == DType::kQ4_1) {
    const uint8_t* blk = row + b * 20;
    *d = testing::GetHalf(blk);
    *m = testing::GetHalf(blk + 2);
    for (int j = 0; j < 16; ++j) {
      w[j] = blk[4 + j] & 0x0f;
      w[j + 16] = blk[4 + j] >> 4;
    }
  } else if (t == DType::kQ4_0) {
    const uint8_t* blk = row + b * 18;
    *d = testing::GetHalf(blk);
    for (int j = 0; j < 16; ++j) {
      w[j] = (blk[2 + j] & 0x0f) - 8;
      w[j + 16] = (blk[2 + j] >> 4) - 8;
    }
  } else {
    const uint8_t* blk = row + b * 34;
    *d = testing::GetHalf(blk);
    for (int j = 0; j < 32; ++j) w[j] = static_cast<int8_t>(blk[2 + j]);
  }
}

// DotRowsQ8's definition: per block, the exact integer dot of its 32 products, converted and
// fused into one accumulator with the block's scale; Q4_1's offsets summed apart and added last.
float Reference(DType t, const uint8_t* row, const Q8Block* x, int64_t n) {
  float acc = 0.0f, offset = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b) {
    int w[32];
    float d, m;
    BlockWeights(t, row, b, w, &d, &m);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += w[j] * x[b].q[j];
    const float scale = d * x[b].d;
    acc = std::fma(scale, static_cast<float>(sum), acc);
    const float term = m * x[b].s;
    offset = offset + term;
  }
  return t == DType::kQ4_1 ? acc + offset : acc;
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

INSTANTIATE_TEST_SUITE_P(Types, DotRowsQ8Test,
                         ::testing::Combine(::testing::Values(DType::kQ4_1, DType::kQ4_0,
                                                              DType::kQ8_0),
                                            ::testing::Values<int64_t>(32, 576, 1536)));

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
      Q8Block x{.d = 1.0f, .s = 0.0f, .sum = 32 * q, .q = {}};
      for (int j = 0; j < 32; ++j) x.q[j] = static_cast<int8_t>(q);
      float out = 0;
      DotRowsQ8(dtype, row.data(), block, 1, &x, 1, 1, 32, &out);
      EXPECT_EQ(out, static_cast<float>(w * q * 32)) << DTypeName(dtype) << " q=" << q;
      EXPECT_EQ(out, Reference(dtype, row.data(), &x, 32)) << DTypeName(dtype) << " q=" << q;
    }
  }
}

}  // namespace
}  // namespace riskkv::cpu
