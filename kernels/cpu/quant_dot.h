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
// multiplies its Q4/Q5/Q8 weights with): x ~= d * q, s = d * sum(q) for the offset term of the
// weight types with a min, and the exact integer sums of all 32 codes and of the first 16 (the
// zero-point corrections of the unsigned weight codes).
struct Q8Block {
  float d;
  float s;
  int32_t sum;
  int32_t sum_lo;
  int8_t q[32];
};

// Quantizes n values (n % 32 == 0) with round-to-nearest-even; d and s are rounded through f16
// like ggml's so integer dot products match llama.cpp's.
void QuantizeQ8(const float* x, int64_t n, Q8Block* out);

// The arithmetic every 8-bit product of a weight row with an activation row follows, for every
// quantized weight type, whichever kernel (row or panel) computes it. Weights are read in blocks
// of 32 values (a K-quant super-block is eight of them); block b of a row has unsigned codes u,
// a float scale d, for some types a float offset m and (Q6_K) two integer sub-scales. Per block,
// with the activation block's codes a:
//   I = sum(u * a) - z * sum(a)                               Q4_0 (z = 8), Q5_0 (16), others 0
//   I = lo * (sum16(u * a) - 32 * sum16(a)) + hi * (...)      Q6_K, over its two halves
//   I = sum(w * a)                                            Q8_0 (signed codes w)
// all exact integers; then acc = fma(d * a.d, float(I), acc) in block order, and for the types
// with an offset (Q4_1, Q5_1: m; Q4_K, Q5_K: -(dmin * m_j)) offset = offset + m * a.s; the output
// is acc (+ offset). d is exact: the block's f16 scale, or for Q4_K and Q5_K the super-block's
// f16 d times the 6-bit sub-block scale (at most 17 significant bits); Q6_K's d is its f16 d.
// The activations use one format for every weight type (blocks of 32, where llama.cpp's K-quant
// products use Q8_K's blocks of 256): products of weights of mixed types share one quantization,
// and each block keeps its own scale.

// The zero point z of t's unsigned codes and whether t adds offsets, in the arithmetic above.
constexpr int ZeroPoint(DType t) { return t == DType::kQ4_0 ? 8 : t == DType::kQ5_0 ? 16 : 0; }
constexpr bool HasOffset(DType t) {
  return t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K;
}

// Whether t takes the 8-bit products (every quantized type).
bool HasQ8Products(DType t);

// The 32 unsigned codes of block b of a row of type t (a quantized type other than Q8_0), in
// value order: the u of the arithmetic above.
void BlockCodes(DType t, const uint8_t* row, int64_t b, uint8_t u[32]);

// Weight rows dotted together by DotRowsQ8: each activation block is loaded once for them.
inline constexpr int kDotRowsQ8 = 2;

// out[r * count + i] = the product above of row r and activation row i for r < n_rows (1 to
// kDotRowsQ8; row r starts at rows + r * row_bytes) and i < count (1 to 4), where activation row
// i starts at xq + i * stride blocks; rows are of type t (HasQ8Products) with n values. Each
// weight block is unpacked once for all `count` rows. Every output is the same bits whatever
// n_rows and count are.
void DotRowsQ8(DType t, const void* rows, int64_t row_bytes, int n_rows, const Q8Block* xq,
               int64_t stride, int count, int64_t n, float* out);

}  // namespace riskkv::cpu
