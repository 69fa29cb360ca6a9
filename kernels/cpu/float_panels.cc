// The panels of F16 and BF16 weight matrices (panels.h) and their f32 products: AVX2 and FMA,
// each output DotF32's sum (fixed_order.h) of its converted row.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/panels.h"

namespace riskkv::cpu {
namespace {

// A float panel is two halves of eight rows; a half holds, for each run of eight columns c, its
// eight rows' values there one row after the other (row i's columns 8c..8c+7 at 64c + 8i), so
// the eight rows' products read the half as one sequential stream.
constexpr int64_t kHalfRows = 8;

struct F16Values {
  static __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct BF16Values {
  static __m256 Load(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

// Rows first .. first + S - 1 of a half against T activation rows: T * S accumulators, each fed
// eight columns at a time in column order and summed by HorizontalSum, as DotF32.
template <int T, int S, typename Values>
void HalfPass(const uint16_t* half, int64_t first, const float* x, int64_t x_stride, int64_t cols,
              float* y, int64_t y_stride) {
  __m256 acc[T][S];
  for (int t = 0; t < T; ++t) {
    for (int s = 0; s < S; ++s) acc[t][s] = _mm256_setzero_ps();
  }
  for (int64_t c = 0; c < cols / 8; ++c) {
    const uint16_t* chunk = half + 64 * c + 8 * first;
    __m256 w[S];
    for (int s = 0; s < S; ++s) w[s] = Values::Load(chunk + 8 * s);
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * x_stride + 8 * c);
      for (int s = 0; s < S; ++s) acc[t][s] = _mm256_fmadd_ps(w[s], xv, acc[t][s]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int s = 0; s < S; ++s) y[t * y_stride + s] = HorizontalSum(acc[t][s]);
  }
}

// The 16 rows of a panel against T activation rows, in passes of S rows (at most eight
// accumulators; a pass re-reads its half from cache).
template <int T, typename Values>
void PanelRows(const uint16_t* panel, const float* x, int64_t x_stride, int64_t cols, float* y,
               int64_t y_stride) {
  constexpr int S = T == 1 ? 8 : T == 2 ? 4 : 2;
  for (int64_t h = 0; h < 2; ++h) {
    const uint16_t* half = panel + h * kHalfRows * cols;
    for (int64_t first = 0; first < kHalfRows; first += S) {
      HalfPass<T, S, Values>(half, first, x, x_stride, cols, y + h * kHalfRows + first, y_stride);
    }
  }
}

template <typename Values>
void PanelTokens(const uint16_t* panel, const float* x, int64_t x_stride, int count, int64_t cols,
                 float* y, int64_t y_stride) {
  switch (count) {
    case 1:
      return PanelRows<1, Values>(panel, x, x_stride, cols, y, y_stride);
    case 2:
      return PanelRows<2, Values>(panel, x, x_stride, cols, y, y_stride);
    case 3:
      return PanelRows<3, Values>(panel, x, x_stride, cols, y, y_stride);
    default:
      return PanelRows<4, Values>(panel, x, x_stride, cols, y, y_stride);
  }
}

}  // namespace

void PackFloatPanels(const uint16_t* rows, int64_t n_rows, int64_t cols, uint16_t* out) {
  for (int64_t p = 0; p < n_rows / kPanelRows; ++p) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t c = 0; c < cols / 8; ++c) {
        for (int64_t i = 0; i < kHalfRows; ++i) {
          const int64_t row = p * kPanelRows + h * kHalfRows + i;
          std::memcpy(out, rows + row * cols + 8 * c, 16);
          out += 8;
        }
      }
    }
  }
}

void DotPanelF32(DType t, const uint8_t* panel, const float* x, int64_t x_stride, int count,
                 int64_t cols, float* y, int64_t y_stride) {
  const auto* p = reinterpret_cast<const uint16_t*>(panel);
  if (t == DType::kBF16) return PanelTokens<BF16Values>(p, x, x_stride, count, cols, y, y_stride);
  PanelTokens<F16Values>(p, x, x_stride, count, cols, y, y_stride);
}

void PanelRowsF32(DType t, const uint8_t* panel, int64_t cols, float* out) {
  const auto* p = reinterpret_cast<const uint16_t*>(panel);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t c = 0; c < cols / 8; ++c) {
      for (int64_t i = 0; i < kHalfRows; ++i) {
        const uint16_t* v = p + (h * cols / 8 + c) * 64 + 8 * i;
        float* dst = out + (h * kHalfRows + i) * cols + 8 * c;
        _mm256_storeu_ps(dst, t == DType::kBF16 ? BF16Values::Load(v) : F16Values::Load(v));
      }
    }
  }
}

}  // namespace riskkv::cpu
