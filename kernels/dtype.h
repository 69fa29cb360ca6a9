// Element types of weights and KV storage, their block layouts, and row dequantization.
// Quantized layouts follow ggml's reference definitions (blocks of 32 values along a row, or
// super-blocks of 256 for the K-quants), and dequantize with its reference arithmetic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace riskkv {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // block of 32: f16 scale d, 32 x int8 q;           x = d * q
  kQ4_0,  // block of 32: f16 scale d, 16 bytes of nibbles;    x = d * (q - 8)
  kQ4_1,  // block of 32: f16 scale d, f16 min m, 16 bytes;    x = d * q + m
  kQ5_0,  // block of 32: f16 d, 4 bytes of 5th bits, 16 bytes; x = d * (q - 16)
  kQ5_1,  // block of 32: f16 d, f16 m, 4 + 16 bytes;          x = d * q + m
  // K-quants: super-blocks of 256 values in sub-blocks with 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K)
  // scales relative to f16 super-block scales (ggml's block_q4_K, block_q5_K, block_q6_K).
  kQ4_K,  // 8 x 32: x = (d * sc) * q - (dmin * m), q in [0, 15]; 144 bytes
  kQ5_K,  // 8 x 32: the same with q in [0, 31];                   176 bytes
  kQ6_K,  // 16 x 16: x = (d * sc) * (q - 32), q in [0, 63];       210 bytes
};

const char* DTypeName(DType t);

// Values per block (1 for plain floating-point types).
int64_t BlockSize(DType t);
// Bytes per block.
int64_t BlockBytes(DType t);
// Bytes of a row of `n` values; `n` must be a multiple of BlockSize(t).
inline int64_t RowBytes(DType t, int64_t n) { return n / BlockSize(t) * BlockBytes(t); }
inline bool IsQuantized(DType t) { return BlockSize(t) > 1; }

// Scalar conversions (IEEE half with round-to-nearest-even, bfloat16 with RNE).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
float BF16ToF32(uint16_t h);
uint16_t F32ToBF16(float f);

// Converts `n` values of type `t` starting at `src` into f32 `dst`.
// `n` must be a multiple of BlockSize(t).
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);
// One block (BlockSize(t) values) of a quantized type, the values DequantizeRow writes for it.
void DequantizeBlock(DType t, const void* block, float* dst);

// The 6-bit scale and min of sub-block j (0 to 7) of a Q4_K / Q5_K super-block whose 12 bytes of
// packed scales start at q (ggml's get_scale_min_k4).
void KQuantScaleMin(int j, const uint8_t* q, int* sc, int* m);

// Bulk f32 <-> f16 conversion (vectorised with F16C where available).
void F32ToF16Row(const float* src, uint16_t* dst, int64_t n);
void F16ToF32Row(const uint16_t* src, float* dst, int64_t n);

}  // namespace riskkv
