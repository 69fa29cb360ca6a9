// Small AVX2 helpers shared by the CPU kernels. The horizontal sum is part of the fixed order of
// operations every float kernel follows (fixed_order.h), so there is exactly one.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error \
    "riskkv's CPU kernels need AVX2, FMA and F16C: build with -march=x86-64-v3 or newer (RISKKV_NATIVE=OFF selects it)"
#endif

namespace riskkv::cpu {

// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// The largest of the eight lanes (exact in any order).
inline float HorizontalMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// The f16 at p (unaligned) as a float.
inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 unsigned / signed bytes -> 8 floats.
inline __m256 U8ToPs(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 I8ToPs(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

// 32 bits as 32 bytes: byte l is `value` where bit l is set, else 0.
inline __m256i BitsToBytes(uint32_t bits, uint8_t value) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(static_cast<char>(value)));
}

}  // namespace riskkv::cpu
