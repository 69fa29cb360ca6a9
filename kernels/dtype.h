// Element types of weights and KV storage, their block layouts, and row dequantization.
// Quantized layouts follow ggml's reference definitions (blocks of 32 values along a row).
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

// Bulk f32 <-> f16 conversion (vectorised with F16C where available).
void F32ToF16Row(const float* src, uint16_t* dst, int64_t n);
void F16ToF32Row(const uint16_t* src, float* dst, int64_t n);

}  // namespace riskkv
