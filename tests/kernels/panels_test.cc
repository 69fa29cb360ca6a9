// The panel kernels of every quantized type (kernels/cpu/panels.h) against the row kernel they
// restate, DotRowsQ8 (itself checked against a scalar statement of the arithmetic in
// quant_dot_test): every output bit for bit, for one to four tokens at a time, random and extreme
// codes; and the CPU backend's MatMul with panels against the same matrix without them, for batches
// of every shape and several thread counts.
#include "kernels/cpu/panels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "tests/kernels/op_reference.h"

namespace riskkv::cpu {
namespace {

Panels Pack(DType t, const std::vector<uint8_t>& rows, int64_t n_rows, int64_t cols) {
  return PackPanels(t, rows.data(), n_rows, cols);
}

std::vector<uint8_t> RandomRows(DType t, int64_t n_rows, int64_t cols, uint32_t seed) {
  const auto values = testing::RandomVector(n_rows * cols, seed, 0.05f);
  std::vector<uint8_t> rows;
  for (int64_t r = 0; r < n_rows; ++r) {
    const auto q = testing::QuantizeRow(t, values.data() + r * cols, cols);
    rows.insert(rows.end(), q.begin(), q.end());
  }
  return rows;
}

std::vector<Q8Block> Activations(int tokens, int64_t cols, uint32_t seed) {
  const auto x = testing::RandomVector(tokens * cols, seed);
  std::vector<Q8Block> xq(tokens * cols / 32);
  for (int t = 0; t < tokens; ++t) QuantizeQ8(x.data() + t * cols, cols, xq.data() + t * cols / 32);
  return xq;
}

// Every output of panels against DotRowsQ8 on the same rows, one to four tokens a call.
void ExpectSameAsRows(DType t, const std::vector<uint8_t>& rows, int64_t n_rows, int64_t cols,
                      const std::vector<Q8Block>& xq, int tokens) {
  const Panels panels = Pack(t, rows, n_rows, cols);
  const int64_t row_bytes = RowBytes(t, cols), blocks = cols / 32;
  for (int count = 1; count <= 4; ++count) {
    std::vector<float> y(tokens * n_rows, -1.0f);
    for (int64_t p = 0; p < n_rows / kPanelRows; ++p) {
      for (int i = 0; i < tokens; i += count) {
        DotPanelQ8(t, panels.get() + p * PanelBytes(t, cols), xq.data() + i * blocks, blocks,
                   std::min(count, tokens - i), cols, y.data() + i * n_rows + p * kPanelRows,
                   n_rows);
      }
    }
    for (int64_t r = 0; r < n_rows; ++r) {
      for (int i = 0; i < tokens; ++i) {
        float want = 0.0f;
        DotRowsQ8(t, rows.data() + r * row_bytes, row_bytes, 1, xq.data() + i * blocks, blocks, 1,
                  cols, &want);
        EXPECT_EQ(y[i * n_rows + r], want)
            << DTypeName(t) << " cols=" << cols << " tokens per call=" << count << " row " << r
            << " token " << i;
      }
    }
  }
}

// On a CPU without AVX-512 VNNI (or with RISKKV_CPU_KERNELS=avx2: avx2_kernels/), the panels'
// AVX2 kernel.
class PanelTest : public ::testing::TestWithParam<std::tuple<DType, int64_t>> {};

TEST_P(PanelTest, EveryOutputEqualsTheRowKernel) {
  const auto [t, cols] = GetParam();
  const int64_t n_rows = 3 * kPanelRows;
  constexpr int kTokens = 5;
  ExpectSameAsRows(t, RandomRows(t, n_rows, cols, 11), n_rows, cols, Activations(kTokens, cols, 12),
                   kTokens);
}

// Rows of random bytes: every code, sub-block scale and min each type can hold.
TEST_P(PanelTest, EveryCodeEqualsTheRowKernel) {
  const auto [t, cols] = GetParam();
  const int64_t n_rows = 2 * kPanelRows;
  constexpr int kTokens = 4;
  ExpectSameAsRows(t, testing::RandomBlocks(t, n_rows, cols, 13), n_rows, cols,
                   Activations(kTokens, cols, 14), kTokens);
}

constexpr DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                            DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<std::tuple<DType, int64_t>> TypesAndWidths() {
  std::vector<std::tuple<DType, int64_t>> out;
  for (const DType t : kTypes) {
    for (const int64_t cols : {32, 256, 576, 1536}) {
      if (cols % BlockSize(t) == 0 && (cols != 256 || BlockSize(t) == 256)) {
        out.emplace_back(t, cols);
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(TypesAndWidths, PanelTest, ::testing::ValuesIn(TypesAndWidths()));

// Q4_1 weights of 15 and 0 against activations of +127 and -127, with scales and offsets of both
// signs: the largest integer dots the format allows, and rows whose outputs cancel.
TEST(Panels, ExtremeCodesEqualTheRowKernel) {
  constexpr int64_t kCols = 64, kRows = kPanelRows;
  std::vector<uint8_t> rows(kRows * RowBytes(DType::kQ4_1, kCols));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kCols / 32; ++b) {
      uint8_t* blk = rows.data() + (r * kCols / 32 + b) * 20;
      const uint16_t d = F32ToF16(r % 2 ? -1.0f : 0.5f), m = F32ToF16(r % 3 ? 0.25f : -2.0f);
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &m, 2);
      for (int j = 0; j < 16; ++j)
        blk[4 + j] = static_cast<uint8_t>(r % 4 == 0 ? 0xff : 0x0f * (j % 2) + 0xf0 * (b % 2));
    }
  }
  std::vector<Q8Block> xq(4 * kCols / 32);
  for (size_t i = 0; i < xq.size(); ++i) {
    xq[i].d = i % 2 ? 0.001f : 3.0f;
    xq[i].s = i % 2 ? -0.5f : 7.0f;
    const int q = i % 4 < 2 ? 127 : -127;
    xq[i].sum = 32 * q;
    for (int j = 0; j < 32; ++j) xq[i].q[j] = static_cast<int8_t>(q);
  }
  ExpectSameAsRows(DType::kQ4_1, rows, kRows, kCols, xq, 4);

  // Q8_0 codes of -128 (whose magnitude only fits an unsigned byte), +127 and 0, so the offset
  // of 128 the panels add to each code spans the whole byte.
  std::vector<uint8_t> q8(kRows * RowBytes(DType::kQ8_0, kCols));
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kCols / 32; ++b) {
      uint8_t* blk = q8.data() + (r * kCols / 32 + b) * 34;
      const uint16_t d = F32ToF16(r % 2 ? -1.0f : 0.5f);
      std::memcpy(blk, &d, 2);
      for (int j = 0; j < 32; ++j) {
        const int code = (r + j) % 3 == 0 ? -128 : (r + j) % 3 == 1 ? 127 : 0;
        blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(code));
      }
    }
  }
  ExpectSameAsRows(DType::kQ8_0, q8, kRows, kCols, xq, 4);
}

// MatMul over a matrix with panels and the same matrix without: the same bits for every batch
// size (one, the small-batch sizes, a token block and a remainder) and thread count.
class PanelMatMulTest : public ::testing::TestWithParam<DType> {};

TEST_P(PanelMatMulTest, EqualsTheRowPath) {
  const DType t = GetParam();
  constexpr int64_t kRows = 5 * kPanelRows, kCols = 1536;
  const std::vector<uint8_t> rows = RandomRows(t, kRows, kCols, 21);
  const Panels panels = Pack(t, rows, kRows, kCols);
  const WeightMatrix plain{t, rows.data(), kRows, kCols};
  WeightMatrix packed = plain;
  packed.panels = panels.get();
  const auto bias = testing::RandomVector(kRows, 22);
  for (const int threads : {1, 3}) {
    auto backend = MakeCpuBackend(threads, ActivationPrecision::kInt8);
    for (const int64_t n : {1, 2, 3, 4, 5, 64, 67, 130}) {
      const auto x = testing::RandomVector(n * kCols, 23 + static_cast<uint32_t>(n));
      std::vector<float> want(n * kRows), got(n * kRows);
      backend->MatMul(x.data(), n, plain, bias.data(), want.data());
      backend->MatMul(x.data(), n, packed, bias.data(), got.data());
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
          << DTypeName(t) << " n=" << n << " threads=" << threads;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, PanelMatMulTest, ::testing::ValuesIn(kTypes));

// F16 and BF16 panels serve f32 products on any AVX2 CPU, in both activation modes: MatMul over
// a matrix with them gives the bits it gives over the GGUF rows for every batch size (the panel
// kernel for a few rows, tiles expanded from the panels for more) and thread count; so does
// MatMulMany beside a Q8_0 matrix with panels, each product taking its own kernel.
TEST(Panels, FloatPanelsEqualTheRowPath) {
  for (const DType t : {DType::kF16, DType::kBF16}) {
    constexpr int64_t kRows = 5 * kPanelRows, kCols = 576;
    ASSERT_TRUE(FitsPanels(t, kRows, kCols));
    ASSERT_FALSE(FitsPanels(t, kRows, kCols + 4));
    ASSERT_FALSE(FitsPanels(t, kRows + 8, kCols));
    const std::vector<uint8_t> rows = RandomRows(t, kRows, kCols, 51);
    const Panels panels = Pack(t, rows, kRows, kCols);
    const WeightMatrix plain{t, rows.data(), kRows, kCols};
    WeightMatrix packed = plain;
    packed.panels = panels.get();
    const std::vector<uint8_t> q_rows = RandomRows(DType::kQ8_0, kRows, kCols, 53);
    const Panels q_panels = Pack(DType::kQ8_0, q_rows, kRows, kCols);
    WeightMatrix quantized{DType::kQ8_0, q_rows.data(), kRows, kCols};
    quantized.panels = q_panels.get();
    for (const ActivationPrecision precision :
         {ActivationPrecision::kF32, ActivationPrecision::kInt8}) {
      for (const int threads : {1, 3}) {
        auto backend = MakeCpuBackend(threads, precision);
        for (const int64_t n : {1, 2, 3, 4, 5, 64, 67}) {
          const auto x = testing::RandomVector(n * kCols, 52 + static_cast<uint32_t>(n));
          std::vector<float> want(n * kRows), got(n * kRows, -1.0f);
          backend->MatMul(x.data(), n, plain, nullptr, want.data());
          backend->MatMul(x.data(), n, packed, nullptr, got.data());
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
              << DTypeName(t) << " n=" << n << " threads=" << threads;
          // Beside a quantized matrix with panels: each product takes its own kernel.
          std::vector<float> many(n * kRows, -1.0f), many_q(n * kRows, -1.0f), want_q(n * kRows);
          backend->MatMul(x.data(), n, quantized, nullptr, want_q.data());
          const MatMulOut outs[] = {{&packed, nullptr, many.data()},
                                    {&quantized, nullptr, many_q.data()}};
          backend->MatMulMany(x.data(), n, outs);
          ASSERT_EQ(std::memcmp(want.data(), many.data(), want.size() * sizeof(float)), 0)
              << DTypeName(t) << " MatMulMany n=" << n << " threads=" << threads;
          ASSERT_EQ(std::memcmp(want_q.data(), many_q.data(), want_q.size() * sizeof(float)), 0)
              << "Q8_0 beside " << DTypeName(t) << " n=" << n << " threads=" << threads;
        }
      }
    }
  }
}

// MatMulMany over several weights of one width and mixed types (a layer's Q, K and V: one pass over
// all their panels, the activations quantized once) gives each product the bits MatMul gives it
// over the GGUF rows; with a weight that has no panels it takes MatMul's path for each.
TEST(Panels, MatMulManyEqualsEachMatMul) {
  constexpr int64_t kCols = 1536;
  const DType types[] = {DType::kQ4_K, DType::kQ8_0, DType::kQ6_K};
  const int64_t rows[] = {5 * kPanelRows, 2 * kPanelRows, 3 * kPanelRows};
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<Panels> panels;
  std::vector<WeightMatrix> plain, packed;
  for (int j = 0; j < 3; ++j) {
    bytes.push_back(RandomRows(types[j], rows[j], kCols, 40 + j));
    panels.push_back(Pack(types[j], bytes.back(), rows[j], kCols));
    plain.push_back({types[j], bytes.back().data(), rows[j], kCols});
    packed.push_back(plain.back());
    packed.back().panels = panels.back().get();
  }
  const auto bias = testing::RandomVector(rows[1], 44);
  for (const bool all_packed : {true, false}) {
    std::vector<WeightMatrix> used = packed;
    if (!all_packed) used[2] = plain[2];
    for (const int threads : {1, 2, 3}) {
      auto backend = MakeCpuBackend(threads, ActivationPrecision::kInt8);
      for (const int64_t n : {1, 3, 8, 16, 67}) {
        const auto x = testing::RandomVector(n * kCols, 45 + static_cast<uint32_t>(n));
        std::vector<std::vector<float>> want(3), got(3);
        std::vector<MatMulOut> outs;
        for (int j = 0; j < 3; ++j) {
          want[j].resize(n * rows[j]);
          got[j].assign(n * rows[j], -1.0f);
          backend->MatMul(x.data(), n, plain[j], j == 1 ? bias.data() : nullptr, want[j].data());
          outs.push_back({&used[j], j == 1 ? bias.data() : nullptr, got[j].data()});
        }
        backend->MatMulMany(x.data(), n, outs);
        for (int j = 0; j < 3; ++j) {
          ASSERT_EQ(std::memcmp(want[j].data(), got[j].data(), want[j].size() * sizeof(float)), 0)
              << "weight " << j << " n=" << n << " threads=" << threads
              << " all packed=" << all_packed;
        }
      }
    }
  }
}

}  // namespace
}  // namespace riskkv::cpu
