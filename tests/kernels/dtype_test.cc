// Element-type conversions and block dequantization against hand-built blocks and known values.
#include "kernels/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>

#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

TEST(DType, HalfKnownValues) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xC000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(1e6f), 0x7C00);  // overflow to +inf
  EXPECT_FLOAT_EQ(F16ToF32(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_FLOAT_EQ(F16ToF32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(F16ToF32(0xFC00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_EQ(F16ToF32(0x8000), 0.0f);
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
}

TEST(DType, HalfRoundTripAllFinite) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), h) << "half 0x" << std::hex << h;
  }
}

TEST(DType, BFloat16) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(BF16ToF32(0x4049), 3.140625f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(F32ToBF16(1.00390625f), 0x3F80);
  EXPECT_EQ(F32ToBF16(1.01171875f), 0x3F82);  // halfway, rounds to even mantissa 2
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, Q4_1HandBuiltBlock) {
  // d = 0.5, m = -1, nibbles j and 15 - j: element j = 0.5 * j - 1, element 16 + j = 0.5 * (15 - j)
  // - 1.
  std::vector<uint8_t> block;
  testing::PutHalf(block, 0.5f);
  testing::PutHalf(block, -1.0f);
  for (int j = 0; j < 16; ++j) block.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  float out[32];
  DequantizeRow(DType::kQ4_1, block.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[16 + j], 0.5f * (15 - j) - 1.0f);
  }
}

TEST(DType, Q4_0AndQ8_0HandBuiltBlocks) {
  std::vector<uint8_t> q4;
  testing::PutHalf(q4, 2.0f);
  for (int j = 0; j < 16; ++j) q4.push_back(static_cast<uint8_t>(j | (8 << 4)));
  float out[32];
  DequantizeRow(DType::kQ4_0, q4.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 8));
    EXPECT_EQ(out[16 + j], 0.0f);
  }
  std::vector<uint8_t> q8;
  testing::PutHalf(q8, 0.25f);
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  DequantizeRow(DType::kQ8_0, q8.data(), out, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.25f * (j - 16));
}

TEST(DType, QuantizationErrorWithinHalfStep) {
  const int64_t n = 256;
  const auto x = testing::RandomVector(n, 7);
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    const auto q = testing::QuantizeRow(t, x.data(), n);
    ASSERT_EQ(static_cast<int64_t>(q.size()), RowBytes(t, n)) << DTypeName(t);
    std::vector<float> y(n);
    DequantizeRow(t, q.data(), y.data(), n);
    for (int64_t b = 0; b < n; b += 32) {
      float amax = 0, lo = x[b], hi = x[b];
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(x[b + j]));
        lo = std::min(lo, x[b + j]);
        hi = std::max(hi, x[b + j]);
      }
      // Largest possible error of each scheme for this block (plus f16 rounding of scales).
      float bound = 0;
      switch (t) {
        case DType::kF16:
          bound = amax * 1e-3f;
          break;
        case DType::kBF16:
          bound = amax * 8e-3f;
          break;
        case DType::kQ8_0:
          bound = amax / 127.0f * 0.51f + amax * 1e-3f;
          break;
        // The side opposite the largest magnitude reaches only 7/8 of it: clipping error <= amax
        // / 8.
        case DType::kQ4_0:
          bound = amax / 8.0f * 1.01f + amax * 2e-3f;
          break;
        case DType::kQ4_1:
          bound = (hi - lo) / 15.0f * 0.51f + amax * 2e-3f;
          break;
        default:
          break;
      }
      for (int j = 0; j < 32; ++j) {
        EXPECT_LE(std::fabs(y[b + j] - x[b + j]), bound) << DTypeName(t) << " element " << b + j;
      }
    }
  }
}

// The test quantizers (op_reference.h) and DequantizeRow agree on each layout: a Gaussian row
// comes back within the relative RMS error its bits allow (measured: Q4_K 0.077, Q5_K 0.038,
// Q6_K 0.022, Q5_0 0.044, Q5_1 0.037 with the same quantizer in tests/tools/make_tiny_models.py;
// bounds 1.5x). A layout read wrongly gives errors of order 1.
TEST(DType, FiveBitAndKQuantRowsRoundTrip) {
  const int64_t n = 1024;
  const auto x = testing::RandomVector(n, 9, 0.07f);
  const std::pair<DType, double> cases[] = {{DType::kQ4_K, 0.115},
                                            {DType::kQ5_K, 0.057},
                                            {DType::kQ6_K, 0.033},
                                            {DType::kQ5_0, 0.066},
                                            {DType::kQ5_1, 0.056}};
  for (const auto& [t, bound] : cases) {
    const auto q = testing::QuantizeRow(t, x.data(), n);
    ASSERT_EQ(static_cast<int64_t>(q.size()), RowBytes(t, n)) << DTypeName(t);
    std::vector<float> y(n);
    DequantizeRow(t, q.data(), y.data(), n);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < n; ++i) {
      err += (y[i] - x[i]) * (y[i] - x[i]);
      norm += x[i] * x[i];
    }
    EXPECT_LT(std::sqrt(err / norm), bound) << DTypeName(t);
    // A block at a time gives the same values.
    std::vector<float> z(n);
    for (int64_t b = 0; b < n / BlockSize(t); ++b) {
      DequantizeBlock(t, q.data() + b * BlockBytes(t), z.data() + b * BlockSize(t));
    }
    EXPECT_EQ(y, z) << DTypeName(t);
  }
}

TEST(DType, Sizes) {
  EXPECT_EQ(RowBytes(DType::kQ4_K, 512), 2 * 144);
  EXPECT_EQ(RowBytes(DType::kQ5_K, 256), 176);
  EXPECT_EQ(RowBytes(DType::kQ6_K, 256), 210);
  EXPECT_EQ(RowBytes(DType::kQ5_0, 64), 44);
  EXPECT_EQ(RowBytes(DType::kQ5_1, 64), 48);
  EXPECT_EQ(BlockSize(DType::kQ6_K), 256);
  EXPECT_EQ(RowBytes(DType::kQ4_1, 576), 18 * 20);
  EXPECT_EQ(RowBytes(DType::kQ8_0, 64), 68);
  EXPECT_EQ(RowBytes(DType::kQ4_0, 32), 18);
  EXPECT_EQ(RowBytes(DType::kF16, 10), 20);
  EXPECT_EQ(RowBytes(DType::kF32, 10), 40);
}

}  // namespace
}  // namespace riskkv
