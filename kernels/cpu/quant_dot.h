// Fused dequantize-and-dot kernels for one weight row against a few activation rows, used by the
// CPU matrix products of small batches (decode) so quantized weights are never expanded in memory.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace riskkv::cpu {

// y[i * y_stride + r] = DotF32(w_r, x + i * x_stride, n) for r < n_rows and i < tokens (1 to 4),
// where w_r is row r of `rows` (row_bytes apart, n values of type t, n a multiple of
// BlockSize(t)) as DequantizeRow writes it, bit for bit; each row is unpacked once for all
// `tokens` rows and never expanded in memory.
void DotDequantizedRows(DType t, const void* rows, int64_t row_bytes, int64_t n_rows,
                        const float* x, int64_t x_stride, int tokens, int64_t n, float* y,
                        int64_t y_stride);

// Activations quantized to 8 bits in blocks of 32, as ggml's Q8_0 / Q8_1 (the layout llama.cpp
// multiplies its Q4/Q8 weights with): x ~= d * q, s = d * sum(q) for the Q4_1 offset term, and
// sum = sum(q) exactly (the panel kernels' correction for their unsigned Q8_0 codes).
struct Q8Block {
  float d;
  float s;
  int32_t sum;
  int8_t q[32];
};

// Quantizes n values (n % 32 == 0) with round-to-nearest-even; d and s are rounded through f16
// like ggml's so integer dot products match llama.cpp's.
void QuantizeQ8(const float* x, int64_t n, Q8Block* out);

// Weight rows dotted together by DotRowsQ8: each activation block is loaded once for them.
inline constexpr int kDotRowsQ8 = 2;

// out[r * count + i] = dot(row r, dequantized activation row i) for r < n_rows (1 to
// kDotRowsQ8; row r starts at rows + r * row_bytes) and i < count (1 to 4), where activation row
// i starts at xq + i * stride blocks; rows are Q4_0, Q4_1 or Q8_0 with n values. Each block's
// dot is one exact integer sum of its 32 products, converted once and fused into the output's
// accumulator with the block's scale (weight d times activation d), in block order; Q4_1 adds
// its offsets (m * s) in a second sum, added at the end. Each weight block is unpacked once for
// all `count` rows. Every output is the same bits whatever n_rows and count are.
void DotRowsQ8(DType t, const void* rows, int64_t row_bytes, int n_rows, const Q8Block* xq,
               int64_t stride, int count, int64_t n, float* out);

}  // namespace riskkv::cpu
