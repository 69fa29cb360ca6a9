// Fused dequantize-and-dot kernels for one weight row against f32 activations, used by the
// CPU matrix-vector path (decode) so quantized weights are never expanded in memory.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace riskkv::cpu {

// Per-block sums of x (n / 32 values); Q4_1 needs them for its per-block offset.
void BlockSums(const float* x, int64_t n, float* sums);

// dot(row, x) where row holds n values of type t (n a multiple of BlockSize(t)).
// block_sums must come from BlockSums(x, n) when t is kQ4_1 and may be null otherwise.
float DotRow(DType t, const void* row, const float* x, const float* block_sums, int64_t n);

}  // namespace riskkv::cpu
