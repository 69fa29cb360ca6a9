// cuBLAS's GEMM definition on the host, to run the engine's GemmPlans without a GPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/gemm_plan.h"

namespace riskkv::testing {

// For each batch b: C = alpha * op(A) * op(B) + beta * C, column-major, with
// op(A)(i, l) = trans_a ? A[l + i * lda] : A[i + l * lda] (likewise B), accumulated in double.
inline void ColumnMajorGemm(const cuda::GemmPlan& p, float alpha, const float* a, const float* b,
                            float beta, float* c) {
  for (int64_t batch = 0; batch < p.batch; ++batch) {
    const float* ab = a + p.offset_a + batch * p.stride_a;
    const float* bb = b + p.offset_b + batch * p.stride_b;
    float* cb = c + p.offset_c + batch * p.stride_c;
    for (int64_t j = 0; j < p.n; ++j) {
      for (int64_t i = 0; i < p.m; ++i) {
        double s = 0.0;
        for (int64_t l = 0; l < p.k; ++l) {
          const float x = p.trans_a ? ab[l + i * p.lda] : ab[i + l * p.lda];
          const float y = p.trans_b ? bb[j + l * p.ldb] : bb[l + j * p.ldb];
          s += static_cast<double>(x) * y;
        }
        float& out = cb[i + j * p.ldc];
        out = static_cast<float>(alpha * s + (beta == 0.0f ? 0.0 : beta * out));
      }
    }
  }
}

}  // namespace riskkv::testing
