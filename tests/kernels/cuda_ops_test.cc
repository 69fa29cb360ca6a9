// Every GPU op against the CPU backend (the oracle), over shapes and weight types, by
// normalised mean squared error with a per-op tolerance (after ggml's test-backend-ops). The GPU
// sees what the engine gives it: weights dequantized to f16, KV in f16. Label gpu: each case
// skips, naming the reason, where no GPU is usable.
#include <gtest/gtest.h>

#include <tuple>

#include "kernels/backend.h"
#include "kernels/gpu.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

using testing::Nmse;
using testing::QuantizeRow;
using testing::RandomVector;

// Per-op NMSE bounds. MatMul and attention round activations (and f32 weights) to f16, whose
// relative step is 2^-11, so their NMSE sits near 1e-7; the others compute in f32 as the CPU does.
constexpr double kMatMulTol = 1e-5;
constexpr double kAttentionTol = 1e-5;
constexpr double kElementwiseTol = 1e-10;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    auto ops = NewGpuOps();
    if (!ops.ok()) GTEST_SKIP() << ops.status().message();
    ops_ = std::move(*ops);
  }
  absl::Status Check(int rc) { return FromGpu(rc, ops_->error()); }
  std::unique_ptr<cuda::Ops> ops_;
  std::unique_ptr<Backend> cpu_ = MakeCpuBackend(0, ActivationPrecision::kF32);
};

std::vector<uint16_t> ToHalfVector(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  F32ToF16Row(x.data(), h.data(), static_cast<int64_t>(x.size()));
  return h;
}

TEST(CudaOpsAvailability, AbsentGpuIsUnavailableWithAReason) {
  auto ops = NewGpuOps();
  if (ops.ok()) {
    EXPECT_NE(*ops, nullptr);
  } else {
    EXPECT_EQ(ops.status().code(), absl::StatusCode::kUnavailable) << ops.status();
    EXPECT_NE(ops.status().message().find("no GPU"), std::string_view::npos) << ops.status();
  }
  auto bad = NewGpuOps(999);  // never a device
  EXPECT_FALSE(bad.ok());
}

class CudaMatMul
    : public CudaOps,
      public ::testing::WithParamInterface<std::tuple<DType, int64_t, int64_t, int64_t>> {};

TEST_P(CudaMatMul, MatchesCpu) {
  const auto [dtype, n, rows, cols] = GetParam();
  const auto values = RandomVector(rows * cols, 21, 0.5f);
  std::vector<uint8_t> stored;
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = QuantizeRow(dtype, values.data() + r * cols, cols);
    stored.insert(stored.end(), q.begin(), q.end());
  }
  const WeightMatrix w{dtype, stored.data(), rows, cols};
  std::vector<float> dequantized(rows * cols);
  for (int64_t r = 0; r < rows; ++r) DequantizeRow(dtype, w.row(r), &dequantized[r * cols], cols);
  const auto w16 = ToHalfVector(dequantized);
  const auto x = RandomVector(n * cols, 22);
  const auto bias = RandomVector(rows, 23);
  std::vector<float> ref(n * rows), got(n * rows);
  cpu_->MatMul(x.data(), n, w, bias.data(), ref.data());
  ASSERT_TRUE(
      Check(ops_->MatMul(x.data(), n, w16.data(), rows, cols, bias.data(), got.data())).ok());
  EXPECT_LT(Nmse(got.data(), ref.data(), n * rows), kMatMulTol)
      << DTypeName(dtype) << " n=" << n << " " << rows << "x" << cols;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaMatMul,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kQ4_1, DType::kQ8_0),
                       ::testing::Values(1, 7, 300), ::testing::Values(64, 576, 1536),
                       ::testing::Values(64, 576)));

TEST_F(CudaOps, RmsNormMatchesCpu) {
  for (const auto& [n, d] : {std::pair<int64_t, int64_t>{1, 64}, {5, 576}, {300, 1536}}) {
    const auto x = RandomVector(n * d, 31, 3.0f);
    const auto w = RandomVector(d, 32);
    std::vector<float> ref(n * d), got(n * d);
    cpu_->RmsNorm(x.data(), n, d, w.data(), 1e-5f, ref.data());
    ASSERT_TRUE(Check(ops_->RmsNorm(x.data(), n, d, w.data(), 1e-5f, got.data())).ok());
    EXPECT_LT(Nmse(got.data(), ref.data(), n * d), kElementwiseTol) << n << "x" << d;
  }
}

TEST_F(CudaOps, RopeForwardAndInverseMatchCpu) {
  for (const RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kHalf}) {
    for (const auto& [n, heads, head_dim, rope_dim] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{3, 9, 64, 64},
          {40, 2, 128, 128},
          {17, 4, 64, 32}}) {
      for (const bool inverse : {false, true}) {
        auto ref = RandomVector(n * heads * head_dim, 41);
        auto got = ref;
        std::vector<int32_t> pos(n);
        for (int64_t i = 0; i < n; ++i) pos[i] = static_cast<int32_t>(7 * i + (i % 3) * 1000);
        const RopeParams p{10000.0, head_dim, rope_dim, layout};
        cpu_->Rope(ref.data(), n, heads, pos.data(), p, inverse);
        ASSERT_TRUE(Check(ops_->Rope(got.data(), n, heads, pos.data(), head_dim, rope_dim, p.base,
                                     layout == RopeLayout::kInterleaved, inverse))
                        .ok());
        EXPECT_LT(Nmse(got.data(), ref.data(), n * heads * head_dim), kElementwiseTol)
            << "layout " << static_cast<int>(layout) << " inverse " << inverse << " d " << head_dim
            << "/" << rope_dim;
      }
    }
  }
}

TEST_F(CudaOps, EmbedIsExactOnF16Tables) {
  const int64_t rows = 1000, cols = 576;
  const auto table16 = ToHalfVector(RandomVector(rows * cols, 51));
  const WeightMatrix table{DType::kF16, table16.data(), rows, cols};
  const std::vector<int32_t> ids = {0, 999, 17, 17, 512};
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> ref(n * cols), got(n * cols);
  cpu_->Embed(table, ids.data(), n, ref.data());
  ASSERT_TRUE(Check(ops_->Embed(table16.data(), rows, cols, ids.data(), n, got.data())).ok());
  EXPECT_EQ(got, ref);
  const int32_t bad = 1000;
  EXPECT_FALSE(Check(ops_->Embed(table16.data(), rows, cols, &bad, 1, got.data())).ok());
}

TEST_F(CudaOps, SwiGluMatchesCpu) {
  for (const int64_t n : {1, 1536, 300 * 1536}) {
    const auto gate = RandomVector(n, 61, 4.0f);
    const auto up = RandomVector(n, 62);
    std::vector<float> ref(n), got(n);
    cpu_->SwiGlu(gate.data(), up.data(), n, ref.data());
    ASSERT_TRUE(Check(ops_->SwiGlu(gate.data(), up.data(), n, got.data())).ok());
    EXPECT_LT(Nmse(got.data(), ref.data(), n), kElementwiseTol) << n;
  }
}

class CudaAttention : public CudaOps,
                      public ::testing::WithParamInterface<
                          std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>> {};

TEST_P(CudaAttention, MatchesCpuOnAnF16Cache) {
  const auto [n, q_pos0, n_heads, n_kv_heads, head_dim] = GetParam();
  const int64_t ctx = q_pos0 + n;
  const auto q = RandomVector(n * n_heads * head_dim, 71);
  const auto k16 = ToHalfVector(RandomVector(ctx * n_kv_heads * head_dim, 72));
  const auto v16 = ToHalfVector(RandomVector(ctx * n_kv_heads * head_dim, 73));
  std::vector<float> ref(n * n_heads * head_dim), got(ref.size());
  cpu_->Attention(q.data(), n, q_pos0, {DType::kF16, k16.data(), ctx},
                  {DType::kF16, v16.data(), ctx}, n_heads, n_kv_heads, head_dim, ref.data());
  ASSERT_TRUE(Check(ops_->Attention(q.data(), n, q_pos0, k16.data(), v16.data(), ctx, n_heads,
                                    n_kv_heads, head_dim, got.data()))
                  .ok());
  EXPECT_LT(Nmse(got.data(), ref.data(), static_cast<int64_t>(ref.size())), kAttentionTol)
      << "n=" << n << " pos0=" << q_pos0 << " heads " << n_heads << "/" << n_kv_heads;
}

// Decode (n = 1) and prefill, MHA and GQA, SmolLM2's 9/3 x 64 and Qwen2.5-1.5B's 12/2 x 128.
INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Values(std::make_tuple(1, 0, 9, 3, 64), std::make_tuple(1, 511, 9, 3, 64),
                      std::make_tuple(17, 100, 9, 3, 64), std::make_tuple(300, 0, 4, 4, 32),
                      std::make_tuple(64, 4032, 12, 2, 128),
                      // the fused decode kernel's last fitting context ((ctx + head_dim) * 4
                      // bytes = 40 KiB), and the GEMM path one position past it
                      std::make_tuple(1, 10111, 8, 2, 128), std::make_tuple(1, 10112, 8, 2, 128)));

}  // namespace
}  // namespace riskkv
