// The panel layouts and their AVX-512 VNNI kernels (panels.h).
#include "kernels/cpu/panels.h"

#include <immintrin.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kernels/cpu/avx2_util.h"
#include "kernels/cpu/cpu_features.h"

namespace riskkv::cpu {
namespace {

// A panel holds, per block of 32 columns, the 16 rows' codes regrouped so that each row is one
// lane of a vector, and their scales side by side. Nibble codes (every type but Q8_0): byte
// 64c + 4r + i of q holds row r's value 4c + i in its low nibble and 16 + 4c + i in its high one,
// so the low nibbles of chunk c are the rows' four-value group c of the integer dot and the high
// nibbles group c + 4. A fifth (Q5_0, Q5_1, Q5_K) or fifth and sixth (Q6_K) code bit is a 64-bit
// mask per group (bit 4r + i: row r's value 4j + i), one plane per bit. Q8_0's codes are the
// groups as they are (group j of row r at q[64j + 4r]), each plus 128 so that it is an unsigned
// byte for vpdpbusd (the 128 * sum(a) this adds to a block's dot is subtracted in exact integers).
// K-quant panels start every eight blocks (a super-block) with the rows' f16 d (and dmin).
struct Layout {
  int header;  // bytes before each super-block's eight blocks
  int block;   // bytes of a block
  int d;       // f16 scales (-1: the super-block's)
  int m;       // f16 offsets (Q4_1, Q5_1)
  int sc;      // 8-bit sub-block scales (K-quants; Q6_K: 16 for values 0-15, then 16 for 16-31)
  int mins;    // 6-bit sub-block mins (Q4_K, Q5_K)
  int bits;    // code bit planes (64 bytes each)
  int planes;
  int q;  // codes
};

constexpr Layout LayoutOf(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return {0, 288, 256, -1, -1, -1, -1, 0, 0};
    case DType::kQ4_1:
      return {0, 320, 0, 32, -1, -1, -1, 0, 64};
    case DType::kQ5_0:
      return {0, 352, 320, -1, -1, -1, 256, 1, 0};
    case DType::kQ5_1:
      return {0, 384, 0, 32, -1, -1, 64, 1, 128};
    case DType::kQ8_0:
      return {0, 544, 0, -1, -1, -1, -1, 0, 32};
    case DType::kQ4_K:
      return {64, 288, -1, -1, 256, 272, -1, 0, 0};
    case DType::kQ5_K:
      return {64, 352, -1, -1, 320, 336, 256, 1, 0};
    case DType::kQ6_K:
      return {64, 416, -1, -1, 384, -1, 256, 2, 0};
    default:
      return {};
  }
}

constexpr bool IsKQuant(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}

// Four activation codes read as one 32-bit group.
typedef int32_t Group __attribute__((may_alias, aligned(4)));

#define RISKKV_PANEL_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))

RISKKV_PANEL_TARGET inline __m512 Negate(__m512 v) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(static_cast<int>(0x80000000))));
}

RISKKV_PANEL_TARGET inline __m512 HalfVector(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 unsigned bytes as floats.
RISKKV_PANEL_TARGET inline __m512 ByteVector(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Lane r of token t's accumulator is DotRowsQ8's output for row r, operation for operation
// (quant_dot.h's arithmetic): per block, the exact integer dot (eight vertical four-value dots in
// two chains, Q6_K's halves apart and times their scales, the zero point's share subtracted),
// converted, times d * a.d, fused in block order; the offsets (m * a.s) summed block by block into
// their own sum, added at the end.
template <int T, DType kT>
RISKKV_PANEL_TARGET void PanelTokens(const uint8_t* panel, const Q8Block* x, int64_t stride,
                                     int64_t blocks, float* y, int64_t y_stride) {
  constexpr Layout L = LayoutOf(kT);
  constexpr bool kOffset = HasOffset(kT);
  // Q8_0's codes are stored plus 128.
  constexpr int kZero = kT == DType::kQ8_0 ? 128 : ZeroPoint(kT);
  __m512 acc[T], offset[T];
  for (int t = 0; t < T; ++t) acc[t] = offset[t] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  __m512 super_d = _mm512_setzero_ps(), super_min = _mm512_setzero_ps();
  const uint8_t* p = panel;
  for (int64_t b = 0; b < blocks; ++b) {
    if constexpr (IsKQuant(kT)) {
      if (b % 8 == 0) {
        super_d = HalfVector(p);
        if constexpr (kOffset) super_min = HalfVector(p + 32);
        p += L.header;
      }
    }
    __m512i w[8];
    if constexpr (kT == DType::kQ8_0) {
      for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(p + L.q + 64 * j);
    } else {
      for (int c = 0; c < 4; ++c) {
        const __m512i q = _mm512_loadu_si512(p + L.q + 64 * c);
        w[c] = _mm512_and_si512(q, low4);
        w[c + 4] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
      }
      for (int plane = 0; plane < L.planes; ++plane) {
        const __m512i bit = _mm512_set1_epi8(static_cast<char>(16 << plane));
        for (int j = 0; j < 8; ++j) {
          uint64_t bits;
          std::memcpy(&bits, p + L.bits + 64 * plane + 8 * j, 8);
          w[j] = _mm512_mask_add_epi8(w[j], _cvtu64_mask64(bits), w[j], bit);
        }
      }
    }
    __m512 d, m = _mm512_setzero_ps();
    __m512i lo_scale = _mm512_setzero_si512(), hi_scale = _mm512_setzero_si512();
    if constexpr (kT == DType::kQ6_K) {
      d = super_d;
      lo_scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + L.sc)));
      hi_scale =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + L.sc + 16)));
    } else if constexpr (IsKQuant(kT)) {
      d = _mm512_mul_ps(super_d, ByteVector(p + L.sc));
      m = Negate(_mm512_mul_ps(super_min, ByteVector(p + L.mins)));
    } else {
      d = HalfVector(p + L.d);
      if constexpr (kOffset) m = HalfVector(p + L.m);
    }
    for (int t = 0; t < T; ++t) {
      const Q8Block& xb = x[t * stride + b];
      // Read in place, so that each broadcast folds into its vpdpbusd as a memory operand.
      const auto* groups = reinterpret_cast<const Group*>(xb.q);
      __m512i dot;
      if constexpr (kT == DType::kQ6_K) {
        __m512i lo = _mm512_set1_epi32(-32 * xb.sum_lo);
        __m512i hi = _mm512_set1_epi32(-32 * (xb.sum - xb.sum_lo));
        for (int j = 0; j < 4; ++j) {
          lo = _mm512_dpbusd_epi32(lo, w[j], _mm512_set1_epi32(groups[j]));
          hi = _mm512_dpbusd_epi32(hi, w[j + 4], _mm512_set1_epi32(groups[j + 4]));
        }
        dot = _mm512_add_epi32(_mm512_mullo_epi32(lo, lo_scale), _mm512_mullo_epi32(hi, hi_scale));
      } else {
        __m512i even = _mm512_set1_epi32(-kZero * xb.sum);
        __m512i odd = _mm512_setzero_si512();
        for (int j = 0; j < 8; j += 2) {
          even = _mm512_dpbusd_epi32(even, w[j], _mm512_set1_epi32(groups[j]));
          odd = _mm512_dpbusd_epi32(odd, w[j + 1], _mm512_set1_epi32(groups[j + 1]));
        }
        dot = _mm512_add_epi32(even, odd);
      }
      acc[t] =
          _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb.d)), _mm512_cvtepi32_ps(dot), acc[t]);
      if constexpr (kOffset) {
        offset[t] = _mm512_add_ps(offset[t], _mm512_mul_ps(m, _mm512_set1_ps(xb.s)));
      }
    }
    p += L.block;
  }
  for (int t = 0; t < T; ++t) {
    _mm512_storeu_ps(y + t * y_stride, kOffset ? _mm512_add_ps(acc[t], offset[t]) : acc[t]);
  }
}

// The same outputs on AVX2 alone, half a panel (eight rows, one 256-bit lane each) at a time:
// a four-value group's dot is vpmaddubsw then vpmaddwd (the pairwise int16 sums stay exact for
// the codes the types allow: unsigned codes up to 63 against |a| <= 127; Q8_0 as |w| times a
// with w's sign, so the 128 its panels add to each code comes off first). The integers are
// those of the VNNI kernel, and every float operation the same, so the bits are too.
template <int T, DType kT>
void PanelTokensAvx2(const uint8_t* panel, const Q8Block* x, int64_t stride, int64_t blocks,
                     float* y, int64_t y_stride) {
  constexpr Layout L = LayoutOf(kT);
  constexpr bool kOffset = HasOffset(kT);
  constexpr int kZero = ZeroPoint(kT);  // Q8_0 is read signed here
  const __m256i low4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  const auto load128 = [](const uint8_t* q) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
  };
  const auto load64 = [](const uint8_t* q) {
    return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  };
  for (int h = 0; h < 2; ++h) {
    __m256 acc[T], offset[T];
    for (int t = 0; t < T; ++t) acc[t] = offset[t] = _mm256_setzero_ps();
    __m256 super_d = _mm256_setzero_ps(), super_min = _mm256_setzero_ps();
    const uint8_t* p = panel;
    for (int64_t b = 0; b < blocks; ++b) {
      if constexpr (IsKQuant(kT)) {
        if (b % 8 == 0) {
          super_d = _mm256_cvtph_ps(load128(p + 16 * h));
          if constexpr (kOffset) super_min = _mm256_cvtph_ps(load128(p + 32 + 16 * h));
          p += L.header;
        }
      }
      __m256i w[8];  // group j of the half's eight rows; Q8_0: the codes' magnitudes
      __m256i sign[8];
      for (int c = 0; c < 4; ++c) {
        if constexpr (kT == DType::kQ8_0) {
          for (int j : {c, c + 4}) {
            sign[j] = _mm256_xor_si256(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + L.q + 64 * j + 32 * h)),
                _mm256_set1_epi8(static_cast<char>(0x80)));
            w[j] = _mm256_sign_epi8(sign[j], sign[j]);
          }
        } else {
          const __m256i q =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + L.q + 64 * c + 32 * h));
          w[c] = _mm256_and_si256(q, low4);
          w[c + 4] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        }
      }
      for (int plane = 0; plane < L.planes; ++plane) {
        for (int j = 0; j < 8; ++j) {
          uint32_t bits;
          std::memcpy(&bits, p + L.bits + 64 * plane + 8 * j + 4 * h, 4);
          w[j] = _mm256_or_si256(w[j], BitsToBytes(bits, static_cast<uint8_t>(16 << plane)));
        }
      }
      __m256 d, m = _mm256_setzero_ps();
      __m256i lo_scale = _mm256_setzero_si256(), hi_scale = _mm256_setzero_si256();
      if constexpr (kT == DType::kQ6_K) {
        d = super_d;
        lo_scale = _mm256_cvtepi8_epi32(load64(p + L.sc + 8 * h));
        hi_scale = _mm256_cvtepi8_epi32(load64(p + L.sc + 16 + 8 * h));
      } else if constexpr (IsKQuant(kT)) {
        d = _mm256_mul_ps(super_d,
                          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load64(p + L.sc + 8 * h))));
        const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load64(p + L.mins + 8 * h)));
        m = _mm256_xor_ps(_mm256_mul_ps(super_min, mins), _mm256_set1_ps(-0.0f));
      } else {
        d = _mm256_cvtph_ps(load128(p + L.d + 16 * h));
        if constexpr (kOffset) m = _mm256_cvtph_ps(load128(p + L.m + 16 * h));
      }
      for (int t = 0; t < T; ++t) {
        const Q8Block& xb = x[t * stride + b];
        const auto* groups = reinterpret_cast<const Group*>(xb.q);
        const auto group_dot = [&](int j) {
          const __m256i a = _mm256_set1_epi32(groups[j]);
          if constexpr (kT == DType::kQ8_0) {
            return _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], _mm256_sign_epi8(a, sign[j])),
                                     ones);
          } else {
            return _mm256_madd_epi16(_mm256_maddubs_epi16(w[j], a), ones);
          }
        };
        __m256i dot;
        if constexpr (kT == DType::kQ6_K) {
          __m256i lo = _mm256_set1_epi32(-32 * xb.sum_lo);
          __m256i hi = _mm256_set1_epi32(-32 * (xb.sum - xb.sum_lo));
          for (int j = 0; j < 4; ++j) {
            lo = _mm256_add_epi32(lo, group_dot(j));
            hi = _mm256_add_epi32(hi, group_dot(j + 4));
          }
          dot =
              _mm256_add_epi32(_mm256_mullo_epi32(lo, lo_scale), _mm256_mullo_epi32(hi, hi_scale));
        } else {
          dot = _mm256_set1_epi32(-kZero * xb.sum);
          for (int j = 0; j < 8; ++j) dot = _mm256_add_epi32(dot, group_dot(j));
        }
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(xb.d)), _mm256_cvtepi32_ps(dot),
                                 acc[t]);
        if constexpr (kOffset) {
          offset[t] = _mm256_add_ps(offset[t], _mm256_mul_ps(m, _mm256_set1_ps(xb.s)));
        }
      }
      p += L.block;
    }
    for (int t = 0; t < T; ++t) {
      _mm256_storeu_ps(y + t * y_stride + 8 * h,
                       kOffset ? _mm256_add_ps(acc[t], offset[t]) : acc[t]);
    }
  }
}

// Tokens at a time, on the kernel this CPU runs (the same bits either way).
template <int T, DType kT>
void PanelKernel(const uint8_t* panel, const Q8Block* x, int64_t stride, int64_t blocks, float* y,
                 int64_t y_stride) {
  if (PanelsSupported()) return PanelTokens<T, kT>(panel, x, stride, blocks, y, y_stride);
  PanelTokensAvx2<T, kT>(panel, x, stride, blocks, y, y_stride);
}

template <DType kT>
void PanelCall(const uint8_t* panel, const Q8Block* x, int64_t stride, int count, int64_t blocks,
               float* y, int64_t y_stride) {
  switch (count) {
    case 1:
      return PanelKernel<1, kT>(panel, x, stride, blocks, y, y_stride);
    case 2:
      return PanelKernel<2, kT>(panel, x, stride, blocks, y, y_stride);
    case 3:
      return PanelKernel<3, kT>(panel, x, stride, blocks, y, y_stride);
    default:
      return PanelKernel<4, kT>(panel, x, stride, blocks, y, y_stride);
  }
}

// Block b of the 16 rows at `rows` (row_bytes apart) into its place `out` in a panel.
void PackBlock(DType t, const Layout& L, const uint8_t* rows, int64_t row_bytes, int64_t b,
               uint8_t* out) {
  for (int64_t r = 0; r < kPanelRows; ++r) {
    const uint8_t* row = rows + r * row_bytes;
    if (t == DType::kQ8_0) {
      const uint8_t* blk = row + b * 34;
      std::memcpy(out + L.d + 2 * r, blk, 2);
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 4; ++i) out[L.q + 64 * j + 4 * r + i] = blk[2 + 4 * j + i] ^ 0x80;
      }
      continue;
    }
    uint8_t u[32];
    BlockCodes(t, row, b, u);
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < 4; ++i) {
        out[L.q + 64 * c + 4 * r + i] =
            static_cast<uint8_t>((u[4 * c + i] & 0x0f) | ((u[16 + 4 * c + i] & 0x0f) << 4));
      }
    }
    for (int plane = 0; plane < L.planes; ++plane) {
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 4; ++i) {
          const int bit = 4 * static_cast<int>(r) + i;
          if ((u[4 * j + i] >> (4 + plane)) & 1) {
            out[L.bits + 64 * plane + 8 * j + bit / 8] |= static_cast<uint8_t>(1 << (bit % 8));
          }
        }
      }
    }
    if (IsKQuant(t)) {
      const int j = static_cast<int>(b % 8);
      if (t == DType::kQ6_K) {
        const int half = j / 4, quarter = j % 4;
        const uint8_t* scales = row + b / 8 * 210 + 192 + 8 * half + 2 * quarter;
        out[L.sc + r] = scales[0];
        out[L.sc + 16 + r] = scales[1];
      } else {
        const uint8_t* sb = row + b / 8 * (t == DType::kQ4_K ? 144 : 176);
        int sc = 0, mn = 0;
        KQuantScaleMin(j, sb + 4, &sc, &mn);
        out[L.sc + r] = static_cast<uint8_t>(sc);
        out[L.mins + r] = static_cast<uint8_t>(mn);
      }
    } else {
      const uint8_t* blk = row + b * BlockBytes(t);
      std::memcpy(out + L.d + 2 * r, blk, 2);
      if (L.m >= 0) std::memcpy(out + L.m + 2 * r, blk + 2, 2);
    }
  }
}

}  // namespace

bool PanelsSupported() {
  static const bool supported = Avx512KernelsAllowed() && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512vnni");
  return supported;
}

bool HasPanels(DType t) { return LayoutOf(t).block > 0 || t == DType::kF16 || t == DType::kBF16; }

bool FitsPanels(DType t, int64_t rows, int64_t cols) {
  const bool half = t == DType::kF16 || t == DType::kBF16;
  return HasPanels(t) && rows % kPanelRows == 0 && (!half || cols % 8 == 0);
}

int64_t PanelBytes(DType t, int64_t cols) {
  if (t == DType::kF16 || t == DType::kBF16) return kPanelRows * cols * 2;
  const Layout L = LayoutOf(t);
  return cols / 32 * L.block + cols / 256 * L.header;
}

void PanelsFree::operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(64)); }

Panels PackPanels(DType t, const void* rows, int64_t n_rows, int64_t cols) {
  const int64_t bytes = n_rows / kPanelRows * PanelBytes(t, cols);
  Panels panels(new (std::align_val_t(64)) uint8_t[bytes]);
  if (t == DType::kF16 || t == DType::kBF16) {
    PackFloatPanels(static_cast<const uint16_t*>(rows), n_rows, cols,
                    reinterpret_cast<uint16_t*>(panels.get()));
    return panels;
  }
  std::memset(panels.get(), 0, bytes);
  const Layout L = LayoutOf(t);
  const auto* src = static_cast<const uint8_t*>(rows);
  const int64_t row_bytes = RowBytes(t, cols);
  uint8_t* out = panels.get();
  for (int64_t p = 0; p < n_rows / kPanelRows; ++p) {
    const uint8_t* panel_rows = src + p * kPanelRows * row_bytes;
    for (int64_t b = 0; b < cols / 32; ++b) {
      if (IsKQuant(t) && b % 8 == 0) {
        // The rows' super-block scales: Q4_K and Q5_K start with d and dmin, Q6_K ends with d.
        for (int64_t r = 0; r < kPanelRows; ++r) {
          const uint8_t* sb = panel_rows + r * row_bytes + b / 8 * BlockBytes(t);
          if (t == DType::kQ6_K) {
            std::memcpy(out + 2 * r, sb + 208, 2);
          } else {
            std::memcpy(out + 2 * r, sb, 2);
            std::memcpy(out + 32 + 2 * r, sb + 2, 2);
          }
        }
        out += L.header;
      }
      PackBlock(t, L, panel_rows, row_bytes, b, out);
      out += L.block;
    }
  }
  return panels;
}

void DotPanelQ8(DType t, const uint8_t* panel, const Q8Block* x, int64_t stride, int count,
                int64_t cols, float* y, int64_t y_stride) {
  const int64_t blocks = cols / 32;
  switch (t) {
    case DType::kQ4_0:
      return PanelCall<DType::kQ4_0>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ4_1:
      return PanelCall<DType::kQ4_1>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ5_0:
      return PanelCall<DType::kQ5_0>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ5_1:
      return PanelCall<DType::kQ5_1>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ8_0:
      return PanelCall<DType::kQ8_0>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ4_K:
      return PanelCall<DType::kQ4_K>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ5_K:
      return PanelCall<DType::kQ5_K>(panel, x, stride, count, blocks, y, y_stride);
    case DType::kQ6_K:
      return PanelCall<DType::kQ6_K>(panel, x, stride, count, blocks, y, y_stride);
    default:  // F16 and BF16 panels are DotPanelF32's; a caller that gets here is wrong
      std::fprintf(stderr, "DotPanelQ8: %s has no 8-bit panels\n", DTypeName(t));
      std::abort();
  }
}

}  // namespace riskkv::cpu
