// The cuBLAS arguments of every GEMM the engine runs, worked out once from row-major shapes.
// cuBLAS is column-major: a row-major [r, c] matrix with row stride ld is, to cuBLAS, a [c, r]
// column-major matrix with leading dimension ld, so each row-major product is posed transposed.
// Plain C++: tests/kernels/cuda_gemm_plan_test.cc runs the plans through a host column-major
// GEMM and checks the row-major results the engine relies on.
#pragma once

#include <cstdint>

namespace riskkv::cuda {

// C = alpha * op(A) * op(B) + beta * C in cuBLAS's column-major terms, for `batch` products whose
// operands lie stride_* elements apart, starting *_offset elements into each buffer.
struct GemmPlan {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int64_t offset_a = 0, offset_b = 0, offset_c = 0;
  int64_t batch = 1;
};

// y[n, rows] (rows ldy apart) = x[n, cols] (rows ldx apart) * w[rows, cols]^T.
// A = w, B = x, C = y.
inline GemmPlan LinearPlan(int64_t n, int64_t rows, int64_t cols, int64_t ldx, int64_t ldy) {
  GemmPlan p;
  p.trans_a = true;
  p.m = rows, p.n = n, p.k = cols;
  p.lda = cols, p.ldb = ldx, p.ldc = ldy;
  return p;
}

// Attention scores of KV head g's query heads: for each query head h = g * group + b,
// scores[h][i][j] = q[i, h, :] . k[j, g, :] over ctx keys, scores laid out [n_heads, n, ctx].
// A = k, B = q (rows ldq apart), C = scores.
inline GemmPlan ScoresPlan(int64_t g, int64_t n, int64_t ctx, int64_t ldq, int64_t n_heads,
                           int64_t n_kv_heads, int64_t head_dim) {
  const int64_t group = n_heads / n_kv_heads;
  GemmPlan p;
  p.trans_a = true;
  p.m = ctx, p.n = n, p.k = head_dim;
  p.lda = n_kv_heads * head_dim, p.ldb = ldq, p.ldc = ctx;
  p.stride_a = 0, p.stride_b = head_dim, p.stride_c = n * ctx;
  p.offset_a = g * head_dim, p.offset_b = g * group * head_dim, p.offset_c = g * group * n * ctx;
  p.batch = group;
  return p;
}

// The weighted values of KV head g's query heads: out[i, h, :] = sum_j probs[h][i][j] v[j, g, :],
// out laid out [n, n_heads, head_dim]. A = v, B = probs, C = out.
inline GemmPlan ValuesPlan(int64_t g, int64_t n, int64_t ctx, int64_t n_heads, int64_t n_kv_heads,
                           int64_t head_dim) {
  const int64_t group = n_heads / n_kv_heads;
  GemmPlan p;
  p.m = head_dim, p.n = n, p.k = ctx;
  p.lda = n_kv_heads * head_dim, p.ldb = ctx, p.ldc = n_heads * head_dim;
  p.stride_a = 0, p.stride_b = n * ctx, p.stride_c = head_dim;
  p.offset_a = g * head_dim, p.offset_b = g * group * n * ctx, p.offset_c = g * group * head_dim;
  p.batch = group;
  return p;
}

// A group's rebuild: rebuilt[count, out] = features[count, f] * a[out, f]^T.
// A = a, B = features, C = rebuilt.
inline GemmPlan RebuildPlan(int64_t count, int64_t out, int64_t f) {
  return LinearPlan(count, out, f, f, out);
}

}  // namespace riskkv::cuda
