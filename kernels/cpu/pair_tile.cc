// DotTile on AVX-512 (fixed_order.h's DotPairTile): two weight rows in one 16-lane vector, each
// half the eight lanes DotF32 accumulates, so a fused multiply-add serves two outputs and each
// output still takes DotF32's operations in DotF32's order.
#include <immintrin.h>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fixed_order.h"

namespace riskkv::cpu {
namespace {

#define RISKKV_PAIR_TARGET __attribute__((target("avx512f")))

// Eight floats in both halves of a vector.
RISKKV_PAIR_TARGET inline __m512 Both(const float* p) {
  const __m512 v = _mm512_zextps256_ps512(_mm256_loadu_ps(p));
  return _mm512_shuffle_f32x4(v, v, 0x44);
}

// T activation rows against P row pairs (pair p starts at pairs + p * 2 * n): T * P vectors of
// two eight-lane sums each.
template <int T, int P>
RISKKV_PAIR_TARGET void PairBlock(const float* pairs, const float* x, int64_t x_stride, int64_t n,
                                  float* y, int64_t y_stride) {
  __m512 acc[T][P];
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p < P; ++p) acc[t][p] = _mm512_setzero_ps();
  }
  for (int64_t c = 0; c < n / 8; ++c) {
    __m512 w[P];
    for (int p = 0; p < P; ++p) {
      w[p] = _mm512_loadu_ps(pairs + p * 2 * n + 16 * c);
      // Keeps the pair in a register for all T tokens: otherwise GCC folds a load of it into
      // every multiply-add, and the loads, not the multiply-adds, bound the loop.
      __asm__("" : "+v"(w[p]));
    }
    for (int t = 0; t < T; ++t) {
      const __m512 xv = Both(x + t * x_stride + 8 * c);
      for (int p = 0; p < P; ++p) acc[t][p] = _mm512_fmadd_ps(w[p], xv, acc[t][p]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int p = 0; p < P; ++p) {
      alignas(64) float lanes[16];
      _mm512_store_ps(lanes, acc[t][p]);
      y[t * y_stride + 2 * p] = HorizontalSum(_mm256_load_ps(lanes));
      y[t * y_stride + 2 * p + 1] = HorizontalSum(_mm256_load_ps(lanes + 8));
    }
  }
}

// Row pairs in blocks of four, then one at a time.
template <int T>
void PairRows(const float* pairs, int64_t n_pairs, const float* x, int64_t x_stride, int64_t n,
              float* y, int64_t y_stride) {
  int64_t p = 0;
  for (; p + 4 <= n_pairs; p += 4) {
    PairBlock<T, 4>(pairs + p * 2 * n, x, x_stride, n, y + 2 * p, y_stride);
  }
  for (; p < n_pairs; ++p) PairBlock<T, 1>(pairs + p * 2 * n, x, x_stride, n, y + 2 * p, y_stride);
}

}  // namespace

bool PairTileSupported() {
  static const bool supported = Avx512KernelsAllowed() && __builtin_cpu_supports("avx512f");
  return supported;
}

void InterleavePairs(const float* rows, int64_t n_rows, int64_t n, float* out) {
  for (int64_t p = 0; p < n_rows / 2; ++p) {
    for (int64_t c = 0; c < n / 8; ++c) {
      for (int64_t h = 0; h < 2; ++h) {
        const float* src = rows + (2 * p + h) * n + 8 * c;
        float* dst = out + p * 2 * n + 16 * c + 8 * h;
        for (int j = 0; j < 8; ++j) dst[j] = src[j];
      }
    }
  }
}

void DotPairTile(const float* pairs, int64_t rows, const float* x, int64_t x_stride, int64_t tokens,
                 int64_t n, float* y, int64_t y_stride) {
  const int64_t n_pairs = rows / 2;
  int64_t t = 0;
  for (; t + 4 <= tokens; t += 4) {
    PairRows<4>(pairs, n_pairs, x + t * x_stride, x_stride, n, y + t * y_stride, y_stride);
  }
  const float* xt = x + t * x_stride;
  float* yt = y + t * y_stride;
  switch (tokens - t) {
    case 3:
      return PairRows<3>(pairs, n_pairs, xt, x_stride, n, yt, y_stride);
    case 2:
      return PairRows<2>(pairs, n_pairs, xt, x_stride, n, yt, y_stride);
    case 1:
      return PairRows<1>(pairs, n_pairs, xt, x_stride, n, yt, y_stride);
    default:
      return;
  }
}

}  // namespace riskkv::cpu
