// AVX2/FMA dot products of quantized or half-precision weight rows: with f32 activations (bit for
// bit the dequantize-then-DotF32 result) and with 8-bit activations (an integer dot per block).
#include "kernels/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

inline __m256i Load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// Block b of a weight row as the integer dot reads it (quant_dot.h's arithmetic).
struct RowBlock {
  __m256i u;   // unsigned codes; Q8_0: the codes' magnitudes
  __m256i w;   // Q8_0: the signed codes
  float d;     // scale of the integer dot
  float m;     // offset per unit of the activations' s
  int32_t lo;  // Q6_K: the sub-scales of values 0-15 and 16-31
  int32_t hi;
};

template <DType kT>
inline void LoadBlock(const uint8_t* row, int64_t b, RowBlock* o) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  if constexpr (kT == DType::kQ8_0) {
    const uint8_t* blk = row + b * 34;
    o->d = Half(blk);
    o->w = Load32(blk + 2);
    o->u = _mm256_sign_epi8(o->w, o->w);
  } else if constexpr (kT == DType::kQ4_0 || kT == DType::kQ4_1) {
    const uint8_t* blk = row + b * (kT == DType::kQ4_1 ? 20 : 18);
    o->d = Half(blk);
    if constexpr (kT == DType::kQ4_1) o->m = Half(blk + 2);
    o->u = Nibbles(blk + (kT == DType::kQ4_1 ? 4 : 2));
  } else if constexpr (kT == DType::kQ5_0 || kT == DType::kQ5_1) {
    constexpr int kHigh = kT == DType::kQ5_1 ? 4 : 2;  // offset of the fifth bits
    const uint8_t* blk = row + b * (kT == DType::kQ5_1 ? 24 : 22);
    o->d = Half(blk);
    if constexpr (kT == DType::kQ5_1) o->m = Half(blk + 2);
    uint32_t bits;
    std::memcpy(&bits, blk + kHigh, 4);
    o->u = _mm256_or_si256(Nibbles(blk + kHigh + 4), BitsToBytes(bits, 0x10));
  } else if constexpr (kT == DType::kQ4_K || kT == DType::kQ5_K) {
    constexpr int64_t kSuper = kT == DType::kQ4_K ? 144 : 176;
    const uint8_t* sb = row + b / 8 * kSuper;
    const int j = static_cast<int>(b % 8);
    int sc = 0, mn = 0;
    KQuantScaleMin(j, sb + 4, &sc, &mn);
    o->d = Half(sb) * static_cast<float>(sc);
    o->m = -(Half(sb + 2) * static_cast<float>(mn));
    const uint8_t* qs = sb + (kT == DType::kQ4_K ? 16 : 48) + (j / 2) * 32;
    __m256i u = _mm256_and_si256(_mm256_srli_epi16(Load32(qs), 4 * (j % 2)), low4);
    if constexpr (kT == DType::kQ5_K) {
      const __m256i fifth =
          _mm256_and_si256(_mm256_srli_epi16(Load32(sb + 16), j), _mm256_set1_epi8(1));
      u = _mm256_or_si256(u, _mm256_slli_epi16(fifth, 4));
    }
    o->u = u;
  } else {
    static_assert(kT == DType::kQ6_K);
    const uint8_t* sb = row + b / 8 * 210;
    const int j = static_cast<int>(b % 8), half = j / 4, quarter = j % 4;
    const __m256i low = _mm256_and_si256(
        _mm256_srli_epi16(Load32(sb + 64 * half + 32 * (quarter & 1)), 4 * (quarter >> 1)), low4);
    const __m256i high = _mm256_and_si256(
        _mm256_srli_epi16(Load32(sb + 128 + 32 * half), 2 * quarter), _mm256_set1_epi8(3));
    o->u = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
    const auto* scales = reinterpret_cast<const int8_t*>(sb + 192) + 8 * half + 2 * quarter;
    o->lo = scales[0];
    o->hi = scales[1];
    o->d = Half(sb + 208);
  }
}

// Dots R weight rows (row_bytes apart) with N activation rows (token t's blocks start at
// x + t * stride): a weight block is unpacked once per N tokens and an activation block loaded
// once per R rows. Output (r, t) goes to out[r * N + t] and takes the same operations in the
// same order whatever R and N are (quant_dot.h's arithmetic), so a row's result does not depend
// on its neighbours.
template <int R, int N, DType kT>
void DotBlocksQ8(const uint8_t* rows, int64_t row_bytes, const Q8Block* x, int64_t stride,
                 int64_t n, float* out) {
  float acc[R][N] = {}, offset[R][N] = {};
  for (int64_t b = 0; b < n / 32; ++b) {
    RowBlock w[R];
    for (int r = 0; r < R; ++r) LoadBlock<kT>(rows + r * row_bytes, b, &w[r]);
    __m256i lanes[R * N];
    for (int t = 0; t < N; ++t) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[t * stride + b].q));
      for (int r = 0; r < R; ++r) {
        if constexpr (kT == DType::kQ8_0) {
          lanes[r * N + t] = DotU8S8(w[r].u, _mm256_sign_epi8(q, w[r].w));
        } else if constexpr (kT == DType::kQ6_K) {
          // Lanes 0-3 hold values 0-15, lanes 4-7 values 16-31: each half times its scale.
          lanes[r * N + t] = _mm256_mullo_epi32(
              DotU8S8(w[r].u, q), _mm256_setr_epi32(w[r].lo, w[r].lo, w[r].lo, w[r].lo, w[r].hi,
                                                    w[r].hi, w[r].hi, w[r].hi));
        } else {
          lanes[r * N + t] = DotU8S8(w[r].u, q);
        }
      }
    }
    int32_t sums[R * N];
    SumLanes<R * N>(lanes, sums);
    for (int t = 0; t < N; ++t) {
      const Q8Block& xb = x[t * stride + b];
      for (int r = 0; r < R; ++r) {
        int32_t dot = sums[r * N + t];
        if constexpr (kT == DType::kQ6_K) {
          dot -= 32 * (w[r].lo * xb.sum_lo + w[r].hi * (xb.sum - xb.sum_lo));
        } else if constexpr (ZeroPoint(kT) != 0) {
          dot -= ZeroPoint(kT) * xb.sum;
        }
        acc[r][t] = std::fma(w[r].d * xb.d, static_cast<float>(dot), acc[r][t]);
        if constexpr (HasOffset(kT)) offset[r][t] = offset[r][t] + w[r].m * xb.s;
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < N; ++t) {
      out[r * N + t] = HasOffset(kT) ? acc[r][t] + offset[r][t] : acc[r][t];
    }
  }
}

template <int R, int N>
void DotRowsQ8N(DType t, const uint8_t* rows, int64_t row_bytes, const Q8Block* x, int64_t stride,
                int64_t n, float* out) {
  switch (t) {
    case DType::kQ4_0:
      return DotBlocksQ8<R, N, DType::kQ4_0>(rows, row_bytes, x, stride, n, out);
    case DType::kQ4_1:
      return DotBlocksQ8<R, N, DType::kQ4_1>(rows, row_bytes, x, stride, n, out);
    case DType::kQ5_0:
      return DotBlocksQ8<R, N, DType::kQ5_0>(rows, row_bytes, x, stride, n, out);
    case DType::kQ5_1:
      return DotBlocksQ8<R, N, DType::kQ5_1>(rows, row_bytes, x, stride, n, out);
    case DType::kQ8_0:
      return DotBlocksQ8<R, N, DType::kQ8_0>(rows, row_bytes, x, stride, n, out);
    case DType::kQ4_K:
      return DotBlocksQ8<R, N, DType::kQ4_K>(rows, row_bytes, x, stride, n, out);
    case DType::kQ5_K:
      return DotBlocksQ8<R, N, DType::kQ5_K>(rows, row_bytes, x, stride, n, out);
    case DType::kQ6_K:
      return DotBlocksQ8<R, N, DType::kQ6_K>(rows, row_bytes, x, stride, n, out);
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:  // float weights never take the 8-bit path
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
      if (j == 15) out->sum_lo = sum;
    }
    out->d = F16ToF32(F32ToF16(d));
    out->s = F16ToF32(F32ToF16(d * static_cast<float>(sum)));
    out->sum = sum;
  }
}

bool HasQ8Products(DType t) { return IsQuantized(t); }

void BlockCodes(DType t, const uint8_t* row, int64_t b, uint8_t u[32]) {
  RowBlock o;
  switch (t) {
    case DType::kQ4_0:
      LoadBlock<DType::kQ4_0>(row, b, &o);
      break;
    case DType::kQ4_1:
      LoadBlock<DType::kQ4_1>(row, b, &o);
      break;
    case DType::kQ5_0:
      LoadBlock<DType::kQ5_0>(row, b, &o);
      break;
    case DType::kQ5_1:
      LoadBlock<DType::kQ5_1>(row, b, &o);
      break;
    case DType::kQ4_K:
      LoadBlock<DType::kQ4_K>(row, b, &o);
      break;
    case DType::kQ5_K:
      LoadBlock<DType::kQ5_K>(row, b, &o);
      break;
    case DType::kQ6_K:
      LoadBlock<DType::kQ6_K>(row, b, &o);
      break;
    default:
      o.u = _mm256_setzero_si256();
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(u), o.u);
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
