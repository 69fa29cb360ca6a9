// The panel layout and its AVX-512 VNNI kernel (q4_1_panels.h).
#include "kernels/cpu/q4_1_panels.h"

#include <immintrin.h>

#include <cstring>

namespace riskkv::cpu {
namespace {

// One block of 32 columns of a panel. Byte 4c + i of row r's 16 nibble bytes (value 4c + i in
// its low nibble, 16 + 4c + i in its high one) goes to q[64c + 4r + i]: the low nibbles of
// chunk c are the rows' values 4c..4c+3, the high nibbles their values 16+4c..16+4c+3, which are
// the four-value groups c and c + 4 of DotRowsQ8's integer dot.
struct PanelBlock {
  uint16_t d[kPanelRows];
  uint16_t m[kPanelRows];
  uint8_t q[4 * 64];
};
static_assert(sizeof(PanelBlock) == kPanelRows * 20);
constexpr int64_t kQ4_1BlockBytes = 20;

#define RISKKV_PANEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

// Tokens 0..T-1 against one panel. Accumulator j of token t holds, per row, lane j of
// DotRowsQ8's accumulator: the integer dot of group j, converted, times d * x.d, fused in block
// order.
template <int T>
RISKKV_PANEL_TARGET void PanelTokens(const PanelBlock* pb, const Q8Block* x, int64_t stride,
                                     int64_t blocks, float* y, int64_t y_stride) {
  __m512 acc[T][8];
  __m512 offset[T];
  for (int t = 0; t < T; ++t) {
    offset[t] = _mm512_setzero_ps();
    for (int j = 0; j < 8; ++j) acc[t][j] = _mm512_setzero_ps();
  }
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b, ++pb) {
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb->d)));
    const __m512 m = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb->m)));
    __m512i w[8];
    for (int c = 0; c < 4; ++c) {
      const __m512i p = _mm512_load_si512(pb->q + 64 * c);
      w[c] = _mm512_and_si512(p, mask);
      w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), mask);
    }
    for (int t = 0; t < T; ++t) {
      const Q8Block& xb = x[t * stride + b];
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xb.d));
      int32_t groups[8];
      std::memcpy(groups, xb.q, sizeof(groups));
      for (int j = 0; j < 8; ++j) {
        const __m512i dot =
            _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[j], _mm512_set1_epi32(groups[j]));
        acc[t][j] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[t][j]);
      }
      offset[t] = _mm512_add_ps(offset[t], _mm512_mul_ps(m, _mm512_set1_ps(xb.s)));
    }
  }
  for (int t = 0; t < T; ++t) {
    // HorizontalSum's order: ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
    const __m512 even =
        _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][4]), _mm512_add_ps(acc[t][2], acc[t][6]));
    const __m512 odd =
        _mm512_add_ps(_mm512_add_ps(acc[t][1], acc[t][5]), _mm512_add_ps(acc[t][3], acc[t][7]));
    _mm512_storeu_ps(y + t * y_stride, _mm512_add_ps(_mm512_add_ps(even, odd), offset[t]));
  }
}

}  // namespace

bool PanelsSupported() {
  static const bool supported = __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vnni");
  return supported;
}

int64_t PanelBytes(int64_t cols) { return cols / 32 * static_cast<int64_t>(sizeof(PanelBlock)); }

void PackQ4_1Panels(const void* rows, int64_t n_rows, int64_t cols, uint8_t* out) {
  const auto* src = static_cast<const uint8_t*>(rows);
  const int64_t blocks = cols / 32, row_bytes = blocks * kQ4_1BlockBytes;
  auto* dst = reinterpret_cast<PanelBlock*>(out);
  for (int64_t p = 0; p < n_rows / kPanelRows; ++p) {
    for (int64_t b = 0; b < blocks; ++b, ++dst) {
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const uint8_t* blk = src + (p * kPanelRows + r) * row_bytes + b * kQ4_1BlockBytes;
        std::memcpy(&dst->d[r], blk, 2);
        std::memcpy(&dst->m[r], blk + 2, 2);
        for (int c = 0; c < 4; ++c) std::memcpy(&dst->q[64 * c + 4 * r], blk + 4 + 4 * c, 4);
      }
    }
  }
}

void DotPanelQ8(const uint8_t* panel, const Q8Block* x, int64_t stride, int count, int64_t cols,
                float* y, int64_t y_stride) {
  const auto* pb = reinterpret_cast<const PanelBlock*>(panel);
  if (count >= 2) return PanelTokens<2>(pb, x, stride, cols / 32, y, y_stride);
  PanelTokens<1>(pb, x, stride, cols / 32, y, y_stride);
}

}  // namespace riskkv::cpu
