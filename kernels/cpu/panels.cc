// The panel layouts and their AVX-512 VNNI kernels (panels.h).
#include "kernels/cpu/panels.h"

#include <immintrin.h>

#include <cstring>
#include <new>

namespace riskkv::cpu {
namespace {

// One block of 32 columns of a Q4_1 panel. Byte 4c + i of row r's 16 nibble bytes (value 4c + i
// in its low nibble, 16 + 4c + i in its high one) goes to q[64c + 4r + i]: the low nibbles of
// chunk c are the rows' values 4c..4c+3, the high nibbles their values 16+4c..16+4c+3, which are
// the four-value groups c and c + 4 of DotRowsQ8's integer dot.
struct Q4_1Block {
  uint16_t d[kPanelRows];
  uint16_t m[kPanelRows];
  uint8_t q[4 * 64];
};
static_assert(sizeof(Q4_1Block) == kPanelRows * 20);

// One block of a Q8_0 panel: group j (values 4j..4j+3) of row r at q[64j + 4r], each value plus
// 128 so that it is an unsigned byte for vpdpbusd; the 128 * sum(x) this adds to a group's dot
// is subtracted in exact integers, which leaves DotRowsQ8's integer sum.
struct Q8_0Block {
  uint16_t d[kPanelRows];
  uint8_t q[8 * 64];
};
static_assert(sizeof(Q8_0Block) == kPanelRows * 34);

// Four activation codes read as one 32-bit group.
typedef int32_t Group __attribute__((may_alias, aligned(4)));

#define RISKKV_PANEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

// Lane r of token t's accumulator is DotRowsQ8's output for row r: per block, the integer dot
// of the 32 products (eight vertical four-value dots, summed as exact integers in two chains),
// converted, times d * x.d, fused in block order; Q4_1 adds m * x.s block by block into its own
// sum, added at the end.
template <int T, bool kQ4_1>
RISKKV_PANEL_TARGET void PanelTokens(const uint8_t* panel, const Q8Block* x, int64_t stride,
                                     int64_t blocks, float* y, int64_t y_stride) {
  __m512 acc[T], offset[T];
  for (int t = 0; t < T; ++t) acc[t] = offset[t] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    __m512 d, m;
    __m512i w[8];
    if constexpr (kQ4_1) {
      const auto* pb = reinterpret_cast<const Q4_1Block*>(panel) + b;
      d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb->d)));
      m = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb->m)));
      for (int c = 0; c < 4; ++c) {
        const __m512i p = _mm512_load_si512(pb->q + 64 * c);
        w[c] = _mm512_and_si512(p, mask);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(p, 4), mask);
      }
    } else {
      const auto* pb = reinterpret_cast<const Q8_0Block*>(panel) + b;
      d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb->d)));
      // 544-byte blocks: only every other one starts on a cache line.
      for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(pb->q + 64 * j);
    }
    for (int t = 0; t < T; ++t) {
      const Q8Block& xb = x[t * stride + b];
      // Read in place, so that each broadcast folds into its vpdpbusd as a memory operand.
      const auto* groups = reinterpret_cast<const Group*>(xb.q);
      // Q8_0 codes are stored plus 128: the block's dot is 128 * sum(q) too large.
      __m512i even = kQ4_1 ? _mm512_setzero_si512() : _mm512_set1_epi32(-128 * xb.sum);
      __m512i odd = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        even = _mm512_dpbusd_epi32(even, w[j], _mm512_set1_epi32(groups[j]));
        odd = _mm512_dpbusd_epi32(odd, w[j + 1], _mm512_set1_epi32(groups[j + 1]));
      }
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), dot, acc[t]);
      if constexpr (kQ4_1) {
        offset[t] = _mm512_add_ps(offset[t], _mm512_mul_ps(m, _mm512_set1_ps(xb.s)));
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(y + t * y_stride, kQ4_1 ? _mm512_add_ps(acc[t], offset[t]) : acc[t]);
  }
}

}  // namespace

bool PanelsSupported() {
  static const bool supported =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return supported;
}

bool HasPanels(DType t) { return t == DType::kQ4_1 || t == DType::kQ8_0; }

int64_t PanelBytes(DType t, int64_t cols) {
  return cols / 32 *
         static_cast<int64_t>(t == DType::kQ4_1 ? sizeof(Q4_1Block) : sizeof(Q8_0Block));
}

void PanelsFree::operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }

Panels PackPanels(DType t, const void* rows, int64_t n_rows, int64_t cols) {
  Panels panels(new (std::align_val_t(64)) uint8_t[n_rows / kPanelRows * PanelBytes(t, cols)]);
  uint8_t* out = panels.get();
  const auto* src = static_cast<const uint8_t*>(rows);
  const int64_t blocks = cols / 32, block_bytes = BlockBytes(t), row_bytes = blocks * block_bytes;
  for (int64_t p = 0; p < n_rows / kPanelRows; ++p) {
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t r = 0; r < kPanelRows; ++r) {
        const uint8_t* blk = src + (p * kPanelRows + r) * row_bytes + b * block_bytes;
        if (t == DType::kQ4_1) {
          auto* dst = reinterpret_cast<Q4_1Block*>(out) + p * blocks + b;
          std::memcpy(&dst->d[r], blk, 2);
          std::memcpy(&dst->m[r], blk + 2, 2);
          for (int c = 0; c < 4; ++c) std::memcpy(&dst->q[64 * c + 4 * r], blk + 4 + 4 * c, 4);
        } else {
          auto* dst = reinterpret_cast<Q8_0Block*>(out) + p * blocks + b;
          std::memcpy(&dst->d[r], blk, 2);
          for (int j = 0; j < 8; ++j) {
            for (int i = 0; i < 4; ++i) dst->q[64 * j + 4 * r + i] = blk[2 + 4 * j + i] ^ 0x80;
          }
        }
      }
    }
  }
  return panels;
}

void DotPanelQ8(DType t, const uint8_t* panel, const Q8Block* x, int64_t stride, int count,
                int64_t cols, float* y, int64_t y_stride) {
  const int64_t blocks = cols / 32;
  const bool q4_1 = t == DType::kQ4_1;
  switch (count) {
    case 1:
      return q4_1 ? PanelTokens<1, true>(panel, x, stride, blocks, y, y_stride)
                  : PanelTokens<1, false>(panel, x, stride, blocks, y, y_stride);
    case 2:
      return q4_1 ? PanelTokens<2, true>(panel, x, stride, blocks, y, y_stride)
                  : PanelTokens<2, false>(panel, x, stride, blocks, y, y_stride);
    case 3:
      return q4_1 ? PanelTokens<3, true>(panel, x, stride, blocks, y, y_stride)
                  : PanelTokens<3, false>(panel, x, stride, blocks, y, y_stride);
    default:
      return q4_1 ? PanelTokens<4, true>(panel, x, stride, blocks, y, y_stride)
                  : PanelTokens<4, false>(panel, x, stride, blocks, y, y_stride);
  }
}

}  // namespace riskkv::cpu
