// AVX2/FMA kernels with a fixed order of operations per output (see fixed_order.h). Register
// blocks of about eight accumulators share loads between outputs and keep the FMA units busy;
// each output still has its own accumulator, fed in the same order as the one-output reference,
// so blocking never changes a bit.
#include "kernels/cpu/fixed_order.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/avx2_util.h"

namespace riskkv::cpu {
namespace {

// kTokens activation rows against kRows weight rows: kTokens * kRows accumulators.
template <int kTokens, int kRows>
void DotBlock(const float* w, int64_t w_stride, const float* x, int64_t x_stride, int64_t n,
              float* y, int64_t y_stride) {
  __m256 acc[kTokens][kRows];
  for (int t = 0; t < kTokens; ++t) {
    for (int r = 0; r < kRows; ++r) acc[t][r] = _mm256_setzero_ps();
  }
  const int64_t n8 = n - n % 8;
  for (int64_t k = 0; k < n8; k += 8) {
    __m256 wv[kRows];
    for (int r = 0; r < kRows; ++r) wv[r] = _mm256_loadu_ps(w + r * w_stride + k);
    for (int t = 0; t < kTokens; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * x_stride + k);
      for (int r = 0; r < kRows; ++r) acc[t][r] = _mm256_fmadd_ps(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    for (int r = 0; r < kRows; ++r) {
      float s = HorizontalSum(acc[t][r]);
      for (int64_t k = n8; k < n; ++k) s = std::fmaf(w[r * w_stride + k], x[t * x_stride + k], s);
      y[t * y_stride + r] = s;
    }
  }
}

// Rows in blocks of kRows (a block of kTokens * kRows accumulators), then one at a time.
template <int kTokens, int kRows>
void DotRows(const float* w, int64_t w_stride, int64_t rows, const float* x, int64_t x_stride,
             int64_t n, float* y, int64_t y_stride) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    DotBlock<kTokens, kRows>(w + r * w_stride, w_stride, x, x_stride, n, y + r, y_stride);
  }
  for (; r < rows; ++r) {
    DotBlock<kTokens, 1>(w + r * w_stride, w_stride, x, x_stride, n, y + r, y_stride);
  }
}

// Columns [d, d + 8 * kVecs) of WeightedRows for kTokens queries starting at query t0.
template <int kTokens, int kVecs>
void WeightedBlock(const float* p, int64_t p_stride, int64_t count, const float* v,
                   int64_t v_stride, int64_t d, float* out, int64_t out_stride) {
  __m256 acc[kTokens][kVecs];
  for (int t = 0; t < kTokens; ++t) {
    for (int c = 0; c < kVecs; ++c) acc[t][c] = _mm256_setzero_ps();
  }
  // Rows every query of the block sees, then the causal tail: query t sees count + t rows.
  for (int64_t j = 0; j < count; ++j) {
    __m256 vv[kVecs];
    for (int c = 0; c < kVecs; ++c) vv[c] = _mm256_loadu_ps(v + j * v_stride + d + 8 * c);
    for (int t = 0; t < kTokens; ++t) {
      const __m256 pj = _mm256_set1_ps(p[t * p_stride + j]);
      for (int c = 0; c < kVecs; ++c) acc[t][c] = _mm256_fmadd_ps(pj, vv[c], acc[t][c]);
    }
  }
  for (int t = 1; t < kTokens; ++t) {
    for (int64_t j = count; j < count + t; ++j) {
      const __m256 pj = _mm256_set1_ps(p[t * p_stride + j]);
      for (int c = 0; c < kVecs; ++c) {
        acc[t][c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + j * v_stride + d + 8 * c), acc[t][c]);
      }
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    for (int c = 0; c < kVecs; ++c) _mm256_storeu_ps(out + t * out_stride + d + 8 * c, acc[t][c]);
  }
}

// Columns in blocks of 8 * kVecs, then 8, then one at a time.
template <int kTokens, int kVecs>
void WeightedColumns(const float* p, int64_t p_stride, int64_t count, const float* v,
                     int64_t v_stride, int64_t width, float* out, int64_t out_stride) {
  const int64_t w8 = width - width % 8;
  int64_t d = 0;
  for (; d + 8 * kVecs <= w8; d += 8 * kVecs) {
    WeightedBlock<kTokens, kVecs>(p, p_stride, count, v, v_stride, d, out, out_stride);
  }
  for (; d < w8; d += 8) {
    WeightedBlock<kTokens, 1>(p, p_stride, count, v, v_stride, d, out, out_stride);
  }
  for (int64_t c = w8; c < width; ++c) {
    for (int t = 0; t < kTokens; ++t) {
      float s = 0.0f;
      for (int64_t j = 0; j < count + t; ++j) {
        s = std::fmaf(p[t * p_stride + j], v[j * v_stride + c], s);
      }
      out[t * out_stride + c] = s;
    }
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
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    DotRows<4, 2>(w, w_stride, rows, x + t * x_stride, x_stride, n, y + t * y_stride, y_stride);
  }
  const float* xt = x + t * x_stride;
  float* yt = y + t * y_stride;
  switch (tokens - t) {
    case 3:
      return DotRows<3, 2>(w, w_stride, rows, xt, x_stride, n, yt, y_stride);
    case 2:
      return DotRows<2, 4>(w, w_stride, rows, xt, x_stride, n, yt, y_stride);
    case 1:
      return DotRows<1, 8>(w, w_stride, rows, xt, x_stride, n, yt, y_stride);
    default:
      return;
  }
}

void WeightedRows(const float* p, int64_t p_stride, int64_t tokens, int64_t count, const float* v,
                  int64_t v_stride, int64_t width, float* out, int64_t out_stride) {
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    WeightedColumns<4, 2>(p + t * p_stride, p_stride, count + t, v, v_stride, width,
                          out + t * out_stride, out_stride);
  }
  const float* pt = p + t * p_stride;
  float* ot = out + t * out_stride;
  switch (tokens - t) {
    case 3:
      return WeightedColumns<3, 2>(pt, p_stride, count + t, v, v_stride, width, ot, out_stride);
    case 2:
      return WeightedColumns<2, 4>(pt, p_stride, count + t, v, v_stride, width, ot, out_stride);
    case 1:
      return WeightedColumns<1, 8>(pt, p_stride, count + t, v, v_stride, width, ot, out_stride);
    default:
      return;
  }
}

}  // namespace riskkv::cpu
