// AVX2/FMA kernels with a fixed order of operations per output (see fixed_order.h). Register
// blocks of about eight accumulators share loads between outputs and keep the FMA units busy;
// each output still has its own accumulator, fed in the same order as the one-output reference,
// so blocking never changes a bit.
#include "kernels/cpu/fixed_order.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/vector_math.h"

namespace riskkv::cpu {
namespace {

// How a kernel reads its weight rows (or attention's cached keys and values): f32 in place, or
// f16 converted exactly to f32 as each group of eight is loaded. Either way every product sees
// the same f32 operand, so the f16 forms give the bits of the f32 ones over converted rows.
struct F32Rows {
  using T = float;
  static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
  static float At(const float* p) { return *p; }
};
struct F16Rows {
  using T = uint16_t;
  static __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float At(const uint16_t* p) { return _cvtsh_ss(*p); }
};

// Strided f16 rows (one head of a KV cache: every n_kv_heads-th slice) are fetched this many
// rows ahead of their use; a hint only, never a result.
constexpr int64_t kPrefetchRows = 16;
inline void Prefetch(const uint16_t* p, int64_t n) {
  for (int64_t b = 0; b < n * 2; b += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + b, _MM_HINT_T0);
  }
}

// kTokens activation rows against kRows weight rows: kTokens * kRows accumulators.
template <int kTokens, int kRows, typename Rows = F32Rows>
void DotBlock(const typename Rows::T* w, int64_t w_stride, const float* x, int64_t x_stride,
              int64_t n, float* y, int64_t y_stride) {
  __m256 acc[kTokens][kRows];
  for (int t = 0; t < kTokens; ++t) {
    for (int r = 0; r < kRows; ++r) acc[t][r] = _mm256_setzero_ps();
  }
  const int64_t n8 = n - n % 8;
  for (int64_t k = 0; k < n8; k += 8) {
    __m256 wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = Rows::Load(w + r * w_stride + k);
    for (int t = 0; t < kTokens; ++t) {
      __m256 xv = _mm256_loadu_ps(x + t * x_stride + k);
      // Keeps the row in a register for all kRows: otherwise GCC folds a load of it into every
      // multiply-add, and the loads, not the multiply-adds, bound the loop.
      __asm__("" : "+x"(xv));
      for (int r = 0; r < kRows; ++r) acc[t][r] = _mm256_fmadd_ps(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    for (int r = 0; r < kRows; ++r) {
      float s = HorizontalSum(acc[t][r]);
      for (int64_t k = n8; k < n; ++k) {
        s = std::fmaf(Rows::At(w + r * w_stride + k), x[t * x_stride + k], s);
      }
      y[t * y_stride + r] = s;
    }
  }
}

// Rows in blocks of kRows (a block of kTokens * kRows accumulators), then one at a time.
template <int kTokens, int kRows, typename Rows>
void DotRows(const typename Rows::T* w, int64_t w_stride, int64_t rows, const float* x,
             int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    if constexpr (std::is_same_v<Rows, F16Rows>) {
      for (int i = 0; i < kRows; ++i) Prefetch(w + (r + kPrefetchRows + i) * w_stride, n);
    }
    DotBlock<kTokens, kRows, Rows>(w + r * w_stride, w_stride, x, x_stride, n, y + r, y_stride);
  }
  for (; r < rows; ++r) {
    DotBlock<kTokens, 1, Rows>(w + r * w_stride, w_stride, x, x_stride, n, y + r, y_stride);
  }
}

// Rows per block for three tokens: three query heads of a KV head over f16 keys (a decode step)
// share each converted row four ways.
template <typename Rows>
constexpr int kThreeTokenRows = std::is_same_v<Rows, F16Rows> ? 2 : 2;

// DotTile over rows read as Rows says.
template <typename Rows>
void DotTileOf(const typename Rows::T* w, int64_t w_stride, int64_t rows, const float* x,
               int64_t x_stride, int64_t tokens, int64_t n, float* y, int64_t y_stride) {
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    DotRows<4, 3, Rows>(w, w_stride, rows, x + t * x_stride, x_stride, n, y + t * y_stride,
                        y_stride);
  }
  const float* xt = x + t * x_stride;
  float* yt = y + t * y_stride;
  switch (tokens - t) {
    case 3:
      return DotRows<3, kThreeTokenRows<Rows>, Rows>(w, w_stride, rows, xt, x_stride, n, yt,
                                                     y_stride);
    case 2:
      return DotRows<2, 4, Rows>(w, w_stride, rows, xt, x_stride, n, yt, y_stride);
    case 1:
      return DotRows<1, 8, Rows>(w, w_stride, rows, xt, x_stride, n, yt, y_stride);
    default:
      return;
  }
}

// Columns [d, d + 8 * kVecs) of WeightedRows for kTokens queries starting at query t0: causal
// (query t sees count + t rows) or, for query heads that share one query's keys, not (each sees
// count rows).
template <int kTokens, int kVecs, bool kCausal, typename Rows>
void WeightedBlock(const float* p, int64_t p_stride, int64_t count, const typename Rows::T* v,
                   int64_t v_stride, int64_t d, float* out, int64_t out_stride) {
  __m256 acc[kTokens][kVecs];
  for (int t = 0; t < kTokens; ++t) {
    for (int c = 0; c < kVecs; ++c) acc[t][c] = _mm256_setzero_ps();
  }
  // Rows every query of the block sees, then the causal tail: query t sees count + t rows.
  for (int64_t j = 0; j < count; ++j) {
    if constexpr (std::is_same_v<Rows, F16Rows>) {
      Prefetch(v + (j + kPrefetchRows) * v_stride + d, 8 * kVecs);
    }
    __m256 vv[kVecs];
    for (int c = 0; c < kVecs; ++c) vv[c] = Rows::Load(v + j * v_stride + d + 8 * c);
    for (int t = 0; t < kTokens; ++t) {
      const __m256 pj = _mm256_set1_ps(p[t * p_stride + j]);
      for (int c = 0; c < kVecs; ++c) acc[t][c] = _mm256_fmadd_ps(pj, vv[c], acc[t][c]);
    }
  }
  for (int t = 1; kCausal && t < kTokens; ++t) {
    for (int64_t j = count; j < count + t; ++j) {
      const __m256 pj = _mm256_set1_ps(p[t * p_stride + j]);
      for (int c = 0; c < kVecs; ++c) {
        acc[t][c] = _mm256_fmadd_ps(pj, Rows::Load(v + j * v_stride + d + 8 * c), acc[t][c]);
      }
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    for (int c = 0; c < kVecs; ++c) _mm256_storeu_ps(out + t * out_stride + d + 8 * c, acc[t][c]);
  }
}

// Columns in blocks of 8 * kVecs, then 8, then one at a time.
template <int kTokens, int kVecs, bool kCausal, typename Rows>
void WeightedColumns(const float* p, int64_t p_stride, int64_t count, const typename Rows::T* v,
                     int64_t v_stride, int64_t width, float* out, int64_t out_stride) {
  const int64_t w8 = width - width % 8;
  int64_t d = 0;
  for (; d + 8 * kVecs <= w8; d += 8 * kVecs) {
    WeightedBlock<kTokens, kVecs, kCausal, Rows>(p, p_stride, count, v, v_stride, d, out,
                                                 out_stride);
  }
  for (; d < w8; d += 8) {
    WeightedBlock<kTokens, 1, kCausal, Rows>(p, p_stride, count, v, v_stride, d, out, out_stride);
  }
  for (int64_t c = w8; c < width; ++c) {
    for (int t = 0; t < kTokens; ++t) {
      float s = 0.0f;
      for (int64_t j = 0; j < count + (kCausal ? t : 0); ++j) {
        s = std::fmaf(p[t * p_stride + j], Rows::At(v + j * v_stride + c), s);
      }
      out[t * out_stride + c] = s;
    }
  }
}

// WeightedRows (kCausal) or its shared-count form, over value rows read as Rows says.
template <bool kCausal, typename Rows>
void WeightedRowsOf(const float* p, int64_t p_stride, int64_t tokens, int64_t count,
                    const typename Rows::T* v, int64_t v_stride, int64_t width, float* out,
                    int64_t out_stride) {
  constexpr int64_t kStep = kCausal ? 1 : 0;  // rows a query sees past the one before it
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    WeightedColumns<4, 2, kCausal, Rows>(p + t * p_stride, p_stride, count + kStep * t, v, v_stride,
                                         width, out + t * out_stride, out_stride);
  }
  const float* pt = p + t * p_stride;
  float* ot = out + t * out_stride;
  const int64_t ct = count + kStep * t;
  switch (tokens - t) {
    case 3:
      return WeightedColumns < 3, kCausal ? 2 : 4, kCausal,
             Rows > (pt, p_stride, ct, v, v_stride, width, ot, out_stride);
    case 2:
      return WeightedColumns<2, 4, kCausal, Rows>(pt, p_stride, ct, v, v_stride, width, ot,
                                                  out_stride);
    case 1:
      return WeightedColumns<1, 8, kCausal, Rows>(pt, p_stride, ct, v, v_stride, width, ot,
                                                  out_stride);
    default:
      return;
  }
}

}  // namespace

float DotF32(const float* a, const float* b, int64_t n) {
  float y;
  DotBlock<1, 1>(a, 0, b, 0, n, &y, 0);
  return y;
}

void DotTile(const float* w, int64_t w_stride, int64_t rows, const float* x, int64_t x_stride,
             int64_t tokens, int64_t n, float* y, int64_t y_stride) {
  DotTileOf<F32Rows>(w, w_stride, rows, x, x_stride, tokens, n, y, y_stride);
}

void DotTileF16(const uint16_t* w, int64_t w_stride, int64_t rows, const float* x, int64_t x_stride,
                int64_t tokens, int64_t n, float* y, int64_t y_stride) {
  DotTileOf<F16Rows>(w, w_stride, rows, x, x_stride, tokens, n, y, y_stride);
}

void WeightedRows(const float* p, int64_t p_stride, int64_t tokens, int64_t count, const float* v,
                  int64_t v_stride, int64_t width, float* out, int64_t out_stride) {
  WeightedRowsOf<true, F32Rows>(p, p_stride, tokens, count, v, v_stride, width, out, out_stride);
}

void WeightedRowsShared(const float* p, int64_t p_stride, int64_t tokens, int64_t count,
                        const float* v, int64_t v_stride, int64_t width, float* out,
                        int64_t out_stride) {
  WeightedRowsOf<false, F32Rows>(p, p_stride, tokens, count, v, v_stride, width, out, out_stride);
}

void WeightedRowsSharedF16(const float* p, int64_t p_stride, int64_t tokens, int64_t count,
                           const uint16_t* v, int64_t v_stride, int64_t width, float* out,
                           int64_t out_stride) {
  WeightedRowsOf<false, F16Rows>(p, p_stride, tokens, count, v, v_stride, width, out, out_stride);
}

void Softmax(float* s, int64_t n, float scale) {
  // Scaling and the max are exact in any order: eight at a time.
  const __m256 sc = _mm256_set1_ps(scale);
  __m256 mx8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t n8 = n - n % 8;
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), sc);
    _mm256_storeu_ps(s + j, x);
    mx8 = _mm256_max_ps(mx8, x);
  }
  float mx = HorizontalMax(mx8);
  for (int64_t j = n8; j < n; ++j) {
    s[j] *= scale;
    mx = std::max(mx, s[j]);
  }
  const __m256 m = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < n8; j += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (n8 < n) {
    // The tail in lanes 0 .. n - n8 - 1; the other lanes hold -inf, whose exp adds zero.
    alignas(32) float tail[8];
    std::fill(std::copy(s + n8, s + n, tail), tail + 8, -std::numeric_limits<float>::infinity());
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_load_ps(tail), m));
    _mm256_store_ps(tail, e);
    std::copy(tail, tail + (n - n8), s + n8);
    sum = _mm256_add_ps(sum, e);
  }
  const float inv = 1.0f / HorizontalSum(sum);
  const __m256 inv8 = _mm256_set1_ps(inv);
  for (int64_t j = 0; j < n8; j += 8) {
    _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv8));
  }
  for (int64_t j = n8; j < n; ++j) s[j] *= inv;
}

void SwiGluRow(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto eight = [&](__m256 g, __m256 u) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), u);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, eight(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    _mm256_store_ps(o, eight(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(o, o + (n - i), out + i);
  }
}

double LogSumExp(const float* x, int64_t n) {
  __m256 mx8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  const int64_t n8 = n - n % 8;
  for (int64_t j = 0; j < n8; j += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(x + j));
  float mx = HorizontalMax(mx8);
  for (int64_t j = n8; j < n; ++j) mx = std::max(mx, x[j]);
  // Lanes 0-3 of each group of eight summed in `lo`, lanes 4-7 in `hi`.
  const __m256d m = _mm256_set1_pd(mx);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  auto add = [&](__m256 v) {
    lo = _mm256_add_pd(lo, Exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), m)));
    hi = _mm256_add_pd(hi, Exp4(_mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), m)));
  };
  for (int64_t j = 0; j < n8; j += 8) add(_mm256_loadu_ps(x + j));
  if (n8 < n) {
    // The tail in lanes 0 .. n - n8 - 1; the other lanes hold -inf, whose exp adds zero.
    alignas(32) float tail[8];
    std::fill(std::copy(x + n8, x + n, tail), tail + 8, -std::numeric_limits<float>::infinity());
    add(_mm256_load_ps(tail));
  }
  // HorizontalSum's order over the eight lanes: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)).
  alignas(32) double l[4];
  _mm256_store_pd(l, _mm256_add_pd(lo, hi));
  return std::log((l[0] + l[2]) + (l[1] + l[3])) + mx;
}

}  // namespace riskkv::cpu
