// The engine's cuBLAS arguments (kernels/cuda/gemm_plan.h) run through a host column-major GEMM
// with cuBLAS's semantics, against the row-major results they stand for: projections with padded
// rows, causal GQA attention (scores, the engine's softmax rule, weighted values) against the CPU
// backend, and a group's rebuild. Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "kernels/backend.h"
#include "kernels/cuda/gemm_plan.h"
#include "tests/kernels/gemm_reference.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

using testing::ColumnMajorGemm;
using testing::Nmse;
using testing::RandomVector;

TEST(GemmPlan, LinearIsXTimesWTransposedOnPaddedRows) {
  const int64_t n = 6, rows = 10, cols = 12, ldx = 15, ldy = 13;
  const auto w = RandomVector(rows * cols, 1), x = RandomVector(n * ldx, 2);
  for (const float beta : {0.0f, 1.0f}) {
    const auto start = RandomVector(n * ldy, 3);
    std::vector<float> y = start, want = start;
    ColumnMajorGemm(cuda::LinearPlan(n, rows, cols, ldx, ldy), 1.0f, w.data(), x.data(), beta,
                    y.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        double s = beta * start[i * ldy + r];
        for (int64_t c = 0; c < cols; ++c)
          s += static_cast<double>(w[r * cols + c]) * x[i * ldx + c];
        want[i * ldy + r] = static_cast<float>(s);
      }
    }
    EXPECT_LT(Nmse(y.data(), want.data(), n * ldy), 1e-12) << "beta " << beta;
    for (int64_t i = 0; i < n; ++i) {  // columns past `rows` are padding and stay
      for (int64_t r = rows; r < ldy; ++r) EXPECT_EQ(y[i * ldy + r], start[i * ldy + r]);
    }
  }
}

// n queries at q_pos0, n_heads, n_kv_heads, head_dim.
using AttentionCase = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>;
class GemmPlanAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(GemmPlanAttention, ScoresSoftmaxValuesMatchTheCpuBackend) {
  const auto [n, q_pos0, n_heads, n_kv_heads, head_dim] = GetParam();
  const int64_t ctx = q_pos0 + n, kv = n_kv_heads * head_dim, qw = n_heads * head_dim;
  const int64_t ldq = qw + 2 * kv;  // queries sit at the start of fused qkv rows
  const auto q = RandomVector(n * ldq, 11), k = RandomVector(ctx * kv, 12),
             v = RandomVector(ctx * kv, 13);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scores(n_heads * n * ctx), out(n * qw);
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    ColumnMajorGemm(cuda::ScoresPlan(g, n, ctx, ldq, n_heads, n_kv_heads, head_dim), scale,
                    k.data(), q.data(), 0.0f, scores.data());
  }
  // The softmax kernel's rule: row (h, i) sees keys [0, q_pos0 + i].
  for (int64_t row = 0; row < n_heads * n; ++row) {
    float* s = scores.data() + row * ctx;
    const int64_t visible = q_pos0 + row % n + 1;
    float mx = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, s[j]);
    for (int64_t j = 0; j < visible; ++j) sum += std::exp(s[j] - mx);
    for (int64_t j = 0; j < ctx; ++j) s[j] = j < visible ? std::exp(s[j] - mx) / sum : 0.0f;
  }
  for (int64_t g = 0; g < n_kv_heads; ++g) {
    ColumnMajorGemm(cuda::ValuesPlan(g, n, ctx, n_heads, n_kv_heads, head_dim), 1.0f, v.data(),
                    scores.data(), 0.0f, out.data());
  }
  std::vector<float> dense_q(n * qw), want(n * qw);
  for (int64_t i = 0; i < n; ++i) {
    std::copy(q.begin() + i * ldq, q.begin() + i * ldq + qw, dense_q.begin() + i * qw);
  }
  MakeCpuBackend(1, ActivationPrecision::kF32)
      ->Attention(dense_q.data(), n, q_pos0, {DType::kF32, k.data(), ctx},
                  {DType::kF32, v.data(), ctx}, n_heads, n_kv_heads, head_dim, want.data());
  EXPECT_LT(Nmse(out.data(), want.data(), n * qw), 1e-10);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmPlanAttention,
                         ::testing::Values(AttentionCase{5, 0, 9, 3, 8},
                                           AttentionCase{3, 20, 4, 4, 16},
                                           AttentionCase{1, 7, 12, 2, 8},
                                           AttentionCase{4, 2, 6, 1, 8}));

}  // namespace
}  // namespace riskkv
