// AVX2/FMA dot products of quantized or half-precision weight rows: with f32 activations (bit for
// bit the dequantize-then-DotF32 result) and with 8-bit activations (integer block dots).
#include "kernels/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx2_util.h"

namespace riskkv::cpu {
namespace {

// Eight weights as floats, exactly as DequantizeRow (kernels/dtype.h) writes them: d * q for
// Q8_0 and Q4_0 (q - 8 for Q4_0), fma(d, q, m) for Q4_1, the converted value for F16 and BF16.
inline __m256 Q4Weights(__m128i nibbles8, __m256 d, __m256 m, bool offset) {
  const __m256 q = U8ToPs(nibbles8);
  return offset ? _mm256_fmadd_ps(d, q, m) : _mm256_mul_ps(d, _mm256_sub_ps(q, m));
}

// kRows quantized rows (row_bytes apart) against kTokens activation rows, one accumulator per
// pair. Each output accumulates eight lanes over the row in index order and ends with DotF32's
// horizontal sum, so it equals DotF32 of the dequantized row bit for bit.
template <int kTokens, int kRows>
void DotQuantBlock(DType t, const uint8_t* rows, int64_t row_bytes, const float* x,
                   int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  __m256 acc[kTokens][kRows];
  for (int i = 0; i < kTokens; ++i) {
    for (int r = 0; r < kRows; ++r) acc[i][r] = _mm256_setzero_ps();
  }
  auto feed = [&](int r, __m256 w, int64_t k) {
    for (int i = 0; i < kTokens; ++i) {
      acc[i][r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(x + i * x_stride + k), acc[i][r]);
    }
  };
  int64_t k = 0;
  switch (t) {
    case DType::kQ4_0:
    case DType::kQ4_1: {
      const bool q4_1 = t == DType::kQ4_1;
      const int64_t block_bytes = q4_1 ? 20 : 18;
      const __m128i mask = _mm_set1_epi8(0x0f);
      for (int64_t b = 0; k < n; k += 32, ++b) {
        for (int r = 0; r < kRows; ++r) {
          const uint8_t* blk = rows + r * row_bytes + b * block_bytes;
          const __m256 d = _mm256_set1_ps(Half(blk));
          const __m256 m = q4_1 ? _mm256_set1_ps(Half(blk + 2)) : _mm256_set1_ps(8.0f);
          const __m128i raw =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q4_1 ? 4 : 2)));
          const __m128i lo = _mm_and_si128(raw, mask);
          const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
          feed(r, Q4Weights(lo, d, m, q4_1), k);
          feed(r, Q4Weights(_mm_srli_si128(lo, 8), d, m, q4_1), k + 8);
          feed(r, Q4Weights(hi, d, m, q4_1), k + 16);
          feed(r, Q4Weights(_mm_srli_si128(hi, 8), d, m, q4_1), k + 24);
        }
      }
      break;
    }
    case DType::kQ8_0:
      for (int64_t b = 0; k < n; k += 32, ++b) {
        for (int r = 0; r < kRows; ++r) {
          const uint8_t* blk = rows + r * row_bytes + b * 34;
          const __m256 d = _mm256_set1_ps(Half(blk));
          const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
          const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
          feed(r, _mm256_mul_ps(d, I8ToPs(q0)), k);
          feed(r, _mm256_mul_ps(d, I8ToPs(_mm_srli_si128(q0, 8))), k + 8);
          feed(r, _mm256_mul_ps(d, I8ToPs(q1)), k + 16);
          feed(r, _mm256_mul_ps(d, I8ToPs(_mm_srli_si128(q1, 8))), k + 24);
        }
      }
      break;
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: {
      // One block of each row at a time through DequantizeBlock (at most 256 floats).
      const int64_t block = BlockSize(t), block_bytes = BlockBytes(t);
      alignas(32) float w[256];
      for (int64_t b = 0; k < n; k += block, ++b) {
        for (int r = 0; r < kRows; ++r) {
          DequantizeBlock(t, rows + r * row_bytes + b * block_bytes, w);
          for (int64_t j = 0; j < block; j += 8) feed(r, _mm256_load_ps(w + j), k + j);
        }
      }
      break;
    }
    case DType::kF16:
    case DType::kBF16:
    case DType::kF32:
      for (; k + 8 <= n; k += 8) {
        for (int r = 0; r < kRows; ++r) {
          const uint8_t* row = rows + r * row_bytes;
          if (t == DType::kF32) {
            feed(r, _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k), k);
            continue;
          }
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row) + k / 8);
          feed(r,
               t == DType::kF16
                   ? _mm256_cvtph_ps(v)
                   : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)),
               k);
        }
      }
      break;
  }
  for (int i = 0; i < kTokens; ++i) {
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* row = rows + r * row_bytes;
      float s = HorizontalSum(acc[i][r]);
      for (int64_t j = k; j < n; ++j) {
        const float w = t == DType::kF32   ? reinterpret_cast<const float*>(row)[j]
                        : t == DType::kF16 ? F16ToF32(reinterpret_cast<const uint16_t*>(row)[j])
                                           : BF16ToF32(reinterpret_cast<const uint16_t*>(row)[j]);
        s = std::fmaf(w, x[i * x_stride + j], s);
      }
      y[i * y_stride + r] = s;
    }
  }
}

// Rows in blocks of kRows, then one at a time.
template <int kTokens, int kRows>
void DotQuantRows(DType t, const uint8_t* rows, int64_t row_bytes, int64_t n_rows, const float* x,
                  int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + kRows <= n_rows; r += kRows) {
    DotQuantBlock<kTokens, kRows>(t, rows + r * row_bytes, row_bytes, x, x_stride, n, y + r,
                                  y_stride);
  }
  for (; r < n_rows; ++r) {
    DotQuantBlock<kTokens, 1>(t, rows + r * row_bytes, row_bytes, x, x_stride, n, y + r, y_stride);
  }
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

void DotDequantizedRows(DType t, const void* rows, int64_t row_bytes, int64_t n_rows,
                        const float* x, int64_t x_stride, int tokens, int64_t n, float* y,
                        int64_t y_stride) {
  const auto* r = static_cast<const uint8_t*>(rows);
  switch (tokens) {
    case 1:
      return DotQuantRows<1, 4>(t, r, row_bytes, n_rows, x, x_stride, n, y, y_stride);
    case 2:
      return DotQuantRows<2, 4>(t, r, row_bytes, n_rows, x, x_stride, n, y, y_stride);
    case 3:
      return DotQuantRows<3, 2>(t, r, row_bytes, n_rows, x, x_stride, n, y, y_stride);
    default:
      return DotQuantRows<4, 2>(t, r, row_bytes, n_rows, x, x_stride, n, y, y_stride);
  }
}

}  // namespace riskkv::cpu
