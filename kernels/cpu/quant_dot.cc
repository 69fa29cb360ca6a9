// AVX2/FMA dot products of quantized or half-precision weight rows: with f32 activations (bit for
// bit the dequantize-then-DotF32 result) and with 8-bit activations (an integer dot per block).
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

// Products u[j] * s[j] over 32 bytes (u unsigned, s signed) summed in fours: 8 int32 lanes,
// lane k = u[4k..4k+3] . s[4k..4k+3]. Callers pass u <= 128 and |s| <= 127, so no pair of
// products leaves int16 and VNNI's int32 dot gives the same lanes as AVX2's pairwise int16 sums.
inline __m256i DotU8S8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// sums[i] = the sum of v[i]'s eight lanes for i < K (K <= 8): exact integers, so the order of
// the additions is free; one tree of pairwise sums serves all K.
template <int K>
inline void SumLanes(const __m256i* v, int32_t* sums) {
  __m256i x[8];
  for (int i = 0; i < 8; ++i) x[i] = i < K ? v[i] : _mm256_setzero_si256();
  // Per 128-bit half: [x0, x1, x2, x3] of each vector's pair sums, then of its quad sums.
  const __m256i q0 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(x[0], x[1]), _mm256_hadd_epi32(x[2], x[3]));
  const __m256i q1 =
      _mm256_hadd_epi32(_mm256_hadd_epi32(x[4], x[5]), _mm256_hadd_epi32(x[6], x[7]));
  const __m256i total = _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                                         _mm256_permute2x128_si256(q0, q1, 0x31));
  alignas(32) int32_t all[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(all), total);
  for (int i = 0; i < K; ++i) sums[i] = all[i];
}

// The 8-bit weight formats DotRowsQ8 multiplies: Q4_1 codes are unsigned (the activation codes
// times them directly, plus the offset term m * s), Q4_0 and Q8_0 codes signed (|w| times the
// activations with w's sign).
enum class Q8Weights { kQ4_1, kQ4_0, kQ8_0 };

// Dots R weight rows (row_bytes apart) with N activation rows (token t's blocks start at
// x + t * stride): a weight block is unpacked once per N tokens and an activation block loaded
// once per R rows. Output (r, t) goes to out[r * N + t] and takes the same operations in the
// same order whatever R and N are, so a row's result does not depend on its neighbours: per
// block, acc = fma(d_w * d_x, float(integer dot of the block), acc); for Q4_1 also
// offset = offset + m * s; then acc + offset.
template <int R, int N, Q8Weights kW>
void DotBlocksQ8(const uint8_t* rows, int64_t row_bytes, const Q8Block* x, int64_t stride,
                 int64_t n, float* out) {
  constexpr bool kQ4_1 = kW == Q8Weights::kQ4_1;
  constexpr int64_t kBlockBytes = kQ4_1 ? 20 : kW == Q8Weights::kQ4_0 ? 18 : 34;
  float acc[R][N] = {}, offset[R][N] = {};
  for (int64_t b = 0; b < n / 32; ++b) {
    __m256i u[R], w[R];  // unsigned codes (Q4_1) or |w|; the signed codes
    float d[R], m[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* blk = rows + r * row_bytes + b * kBlockBytes;
      d[r] = Half(blk);
      if constexpr (kQ4_1) {
        u[r] = Nibbles(blk + 4);
        m[r] = Half(blk + 2);
      } else {
        w[r] = kW == Q8Weights::kQ4_0
                   ? _mm256_sub_epi8(Nibbles(blk + 2), _mm256_set1_epi8(8))
                   : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
        u[r] = _mm256_sign_epi8(w[r], w[r]);
      }
    }
    __m256i lanes[R * N];
    for (int t = 0; t < N; ++t) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t * stride + b].q));
      for (int r = 0; r < R; ++r) {
        if constexpr (kQ4_1) {
          lanes[r * N + t] = DotU8S8(u[r], q);
        } else {
          lanes[r * N + t] = DotU8S8(u[r], _mm256_sign_epi8(q, w[r]));
        }
      }
    }
    int32_t sums[R * N];
    SumLanes<R * N>(lanes, sums);
    for (int t = 0; t < N; ++t) {
      const Q8Block& xb = x[t * stride + b];
      for (int r = 0; r < R; ++r) {
        acc[r][t] = std::fma(d[r] * xb.d, static_cast<float>(sums[r * N + t]), acc[r][t]);
        if constexpr (kQ4_1) offset[r][t] = offset[r][t] + m[r] * xb.s;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < N; ++t) out[r * N + t] = kQ4_1 ? acc[r][t] + offset[r][t] : acc[r][t];
  }
}

template <int R, int N>
void DotRowsQ8N(DType t, const uint8_t* rows, int64_t row_bytes, const Q8Block* x, int64_t stride,
                int64_t n, float* out) {
  switch (t) {
    case DType::kQ4_1:
      return DotBlocksQ8<R, N, Q8Weights::kQ4_1>(rows, row_bytes, x, stride, n, out);
    case DType::kQ4_0:
      return DotBlocksQ8<R, N, Q8Weights::kQ4_0>(rows, row_bytes, x, stride, n, out);
    case DType::kQ8_0:
      return DotBlocksQ8<R, N, Q8Weights::kQ8_0>(rows, row_bytes, x, stride, n, out);
    default:  // float weights never take the 8-bit path
      for (int i = 0; i < R * N; ++i) out[i] = 0.0f;
  }
}

template <int R>
void DotRowsQ8R(DType t, const uint8_t* rows, int64_t row_bytes, const Q8Block* x, int64_t stride,
                int count, int64_t n, float* out) {
  switch (count) {
    case 1:
      return DotRowsQ8N<R, 1>(t, rows, row_bytes, x, stride, n, out);
    case 2:
      return DotRowsQ8N<R, 2>(t, rows, row_bytes, x, stride, n, out);
    case 3:
      return DotRowsQ8N<R, 3>(t, rows, row_bytes, x, stride, n, out);
    default:
      return DotRowsQ8N<R, 4>(t, rows, row_bytes, x, stride, n, out);
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
    out->sum = sum;
  }
}

void DotRowsQ8(DType t, const void* rows, int64_t row_bytes, int n_rows, const Q8Block* xq,
               int64_t stride, int count, int64_t n, float* out) {
  const auto* r = static_cast<const uint8_t*>(rows);
  if (n_rows >= kDotRowsQ8)
    return DotRowsQ8R<kDotRowsQ8>(t, r, row_bytes, xq, stride, count, n, out);
  for (int i = 0; i < n_rows; ++i) {
    DotRowsQ8R<1>(t, r + i * row_bytes, row_bytes, xq, stride, count, n, out + i * count);
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
