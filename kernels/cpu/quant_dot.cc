// AVX2/FMA dot products of quantized or half-precision rows with f32 vectors. Activations stay
// f32 (no activation quantization), so results match the dequantize-then-GEMM path to rounding.
#include "kernels/cpu/quant_dot.h"

#include <immintrin.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error \
    "riskkv's CPU kernels need AVX2, FMA and F16C: build with -march=x86-64-v3 or newer (RISKKV_NATIVE=OFF selects it)"
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

namespace riskkv::cpu {
namespace {

inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 8 unsigned bytes -> 8 floats.
inline __m256 U8ToPs(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)); }
inline __m256 I8ToPs(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

// Sum over the block of q[j] * x[j] for the 32 nibbles of a Q4 block (low nibbles are elements
// 0..15, high nibbles 16..31, as in ggml).
inline __m256 NibbleDot(const uint8_t* qs, const float* x) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  __m256 acc = _mm256_mul_ps(U8ToPs(lo), _mm256_loadu_ps(x));
  acc = _mm256_fmadd_ps(U8ToPs(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), acc);
  acc = _mm256_fmadd_ps(U8ToPs(hi), _mm256_loadu_ps(x + 16), acc);
  acc = _mm256_fmadd_ps(U8ToPs(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), acc);
  return acc;
}

float DotQ4_1(const uint8_t* row, const float* x, const float* sums, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  float offset = 0.0f;
  for (int64_t b = 0; b < n / 32; ++b, row += 20, x += 32) {
    const __m256 d = _mm256_set1_ps(Half(row));
    offset += Half(row + 2) * sums[b];
    acc = _mm256_fmadd_ps(d, NibbleDot(row + 4, x), acc);
  }
  return HorizontalSum(acc) + offset;
}

float DotQ4_0(const uint8_t* row, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t b = 0; b < n / 32; ++b, row += 18, x += 32) {
    const __m256 d = _mm256_set1_ps(Half(row));
    // sum (q - 8) x = sum q x - 8 sum x
    __m256 sx = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                              _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
    const __m256 block = _mm256_fnmadd_ps(eight, sx, NibbleDot(row + 2, x));
    acc = _mm256_fmadd_ps(d, block, acc);
  }
  return HorizontalSum(acc);
}

float DotQ8_0(const uint8_t* row, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / 32; ++b, row += 34, x += 32) {
    const __m256 d = _mm256_set1_ps(Half(row));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 18));
    __m256 block = _mm256_mul_ps(I8ToPs(q0), _mm256_loadu_ps(x));
    block = _mm256_fmadd_ps(I8ToPs(_mm_srli_si128(q0, 8)), _mm256_loadu_ps(x + 8), block);
    block = _mm256_fmadd_ps(I8ToPs(q1), _mm256_loadu_ps(x + 16), block);
    block = _mm256_fmadd_ps(I8ToPs(_mm_srli_si128(q1, 8)), _mm256_loadu_ps(x + 24), block);
    acc = _mm256_fmadd_ps(d, block, acc);
  }
  return HorizontalSum(acc);
}

float DotF16(const uint16_t* row, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
    acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
  }
  float s = HorizontalSum(acc);
  for (; i < n; ++i) s += F16ToF32(row[i]) * x[i];
  return s;
}

float DotBF16(const uint16_t* row, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i));
    const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i), acc);
  }
  float s = HorizontalSum(acc);
  for (; i < n; ++i) s += BF16ToF32(row[i]) * x[i];
  return s;
}

float DotF32(const float* row, const float* x, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(row + i), _mm256_loadu_ps(x + i), acc);
  float s = HorizontalSum(acc);
  for (; i < n; ++i) s += row[i] * x[i];
  return s;
}

inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  return _mm256_set_m128i(hi, lo);  // elements 0..15 then 16..31
}

// Sum of u[j] * s[j] over 32 bytes (u unsigned, s signed) as 8 int32 lanes, as floats.
inline __m256 DotU8S8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// Each kernel dots one weight row with N activation rows (token t's blocks start at
// x + t * stride): the weight block is loaded and unpacked once per N tokens.
template <int N>
void DotQ4_1Q8(const uint8_t* row, const Q8Block* x, int64_t stride, int64_t n, float* out) {
  __m256 acc[N];
  float offset[N];
  for (int t = 0; t < N; ++t) {
    acc[t] = _mm256_setzero_ps();
    offset[t] = 0.0f;
  }
  for (int64_t b = 0; b < n / 32; ++b, row += 20) {
    const __m256i w = Nibbles(row + 4);
    const float d = Half(row), m = Half(row + 2);
    for (int t = 0; t < N; ++t) {
      const Q8Block& xb = x[t * stride + b];
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), DotU8S8(w, q), acc[t]);
      offset[t] += m * xb.s;
    }
  }
  for (int t = 0; t < N; ++t) out[t] = HorizontalSum(acc[t]) + offset[t];
}

// Q4_0 and Q8_0 weights are signed: |w| times sign(w)-adjusted activations.
template <int N, bool kQ4>
void DotSignedQ8(const uint8_t* row, const Q8Block* x, int64_t stride, int64_t n, float* out) {
  __m256 acc[N];
  for (int t = 0; t < N; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t block_bytes = kQ4 ? 18 : 34;
  for (int64_t b = 0; b < n / 32; ++b, row += block_bytes) {
    const __m256i w = kQ4 ? _mm256_sub_epi8(Nibbles(row + 2), _mm256_set1_epi8(8))
                          : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2));
    const __m256i w_abs = _mm256_sign_epi8(w, w);
    const float d = Half(row);
    for (int t = 0; t < N; ++t) {
      const Q8Block& xb = x[t * stride + b];
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q));
      acc[t] =
          _mm256_fmadd_ps(_mm256_set1_ps(d * xb.d), DotU8S8(w_abs, _mm256_sign_epi8(q, w)), acc[t]);
    }
  }
  for (int t = 0; t < N; ++t) out[t] = HorizontalSum(acc[t]);
}

template <int N>
void DotRowsQ8N(DType t, const uint8_t* row, const Q8Block* x, int64_t stride, int64_t n,
                float* out) {
  switch (t) {
    case DType::kQ4_1:
      return DotQ4_1Q8<N>(row, x, stride, n, out);
    case DType::kQ4_0:
      return DotSignedQ8<N, true>(row, x, stride, n, out);
    case DType::kQ8_0:
      return DotSignedQ8<N, false>(row, x, stride, n, out);
    default:  // float weights never take the 8-bit path
      for (int i = 0; i < N; ++i) out[i] = 0.0f;
  }
}

}  // namespace

void QuantizeQ8(const float* x, int64_t n, Q8Block* out) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, ++out) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(x[j] * id));
      out->q[j] = static_cast<int8_t>(q);
      sum += q;
    }
    out->d = F16ToF32(F32ToF16(d));
    out->s = F16ToF32(F32ToF16(d * static_cast<float>(sum)));
  }
}

void DotRowQ8(DType t, const void* row, const Q8Block* xq, int64_t stride, int count, int64_t n,
              float* out) {
  const auto* r = static_cast<const uint8_t*>(row);
  switch (count) {
    case 1:
      return DotRowsQ8N<1>(t, r, xq, stride, n, out);
    case 2:
      return DotRowsQ8N<2>(t, r, xq, stride, n, out);
    case 3:
      return DotRowsQ8N<3>(t, r, xq, stride, n, out);
    default:
      return DotRowsQ8N<4>(t, r, xq, stride, n, out);
  }
}

void BlockSums(const float* x, int64_t n, float* sums) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                             _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
    sums[b] = HorizontalSum(s);
  }
}

float DotRow(DType t, const void* row, const float* x, const float* block_sums, int64_t n) {
  const auto* r = static_cast<const uint8_t*>(row);
  switch (t) {
    case DType::kQ4_1:
      return DotQ4_1(r, x, block_sums, n);
    case DType::kQ4_0:
      return DotQ4_0(r, x, n);
    case DType::kQ8_0:
      return DotQ8_0(r, x, n);
    case DType::kF16:
      return DotF16(reinterpret_cast<const uint16_t*>(r), x, n);
    case DType::kBF16:
      return DotBF16(reinterpret_cast<const uint16_t*>(r), x, n);
    case DType::kF32:
      return DotF32(reinterpret_cast<const float*>(r), x, n);
  }
  return 0.0f;
}

}  // namespace riskkv::cpu
