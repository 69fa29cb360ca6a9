// Element types: block layouts, scalar and row conversions to f32.
#include "kernels/dtype.h"

#include <immintrin.h>

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error \
    "riskkv's CPU kernels need AVX2, FMA and F16C: build with -march=x86-64-v3 or newer (RISKKV_NATIVE=OFF selects it)"
#endif

#include <cmath>
#include <cstring>

namespace riskkv {
namespace {

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[16];
};
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit j: the fifth bit of value j
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
constexpr int kQK = 256;  // values per K-quant super-block
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];  // eight 6-bit scales and eight 6-bit mins, packed
  uint8_t qs[kQK / 2];
};
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK / 8];
  uint8_t qs[kQK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQK / 2];  // low four bits
  uint8_t qh[kQK / 4];  // high two bits
  int8_t scales[kQK / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);

// Q4_K and Q5_K: eight sub-blocks of 32, value = (d * sc) * q - (dmin * m), two roundings as
// ggml's reference dequantizer (and gguf-py's) computes it. qh is null for Q4_K.
void DequantizeK4K5(uint16_t d16, uint16_t dmin16, const uint8_t* scales, const uint8_t* qh,
                    const uint8_t* qs, float* y) {
  const float d = F16ToF32(d16), dmin = F16ToF32(dmin16);
  for (int j = 0; j < 8; ++j) {
    int sc = 0, m = 0;
    KQuantScaleMin(j, scales, &sc, &m);
    const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
    const uint8_t* q = qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0xf;
      if (qh != nullptr) v |= ((qh[l] >> j) & 1) << 4;
      y[j * 32 + l] = ds * static_cast<float>(v) - dm;
    }
  }
}

}  // namespace

void KQuantScaleMin(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void DequantizeBlock(DType t, const void* block, float* y) {
  switch (t) {
    case DType::kQ5_0:
    case DType::kQ5_1: {
      const bool q5_1 = t == DType::kQ5_1;
      const auto* b0 = static_cast<const BlockQ5_0*>(block);
      const auto* b1 = static_cast<const BlockQ5_1*>(block);
      const float d = F16ToF32(q5_1 ? b1->d : b0->d);
      const float m = q5_1 ? F16ToF32(b1->m) : 0.0f;
      const uint8_t* qh_bytes = q5_1 ? b1->qh : b0->qh;
      const uint8_t* qs = q5_1 ? b1->qs : b0->qs;
      uint32_t qh = 0;
      std::memcpy(&qh, qh_bytes, 4);
      for (int j = 0; j < 16; ++j) {
        const int lo = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
        const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
        if (q5_1) {
          // One rounding, as Q4_1 (and ggml's CPU dot products) compute d * q + m.
          y[j] = std::fmaf(d, static_cast<float>(lo), m);
          y[j + 16] = std::fmaf(d, static_cast<float>(hi), m);
        } else {
          y[j] = d * static_cast<float>(lo - 16);
          y[j + 16] = d * static_cast<float>(hi - 16);
        }
      }
      return;
    }
    case DType::kQ4_K: {
      const auto* b = static_cast<const BlockQ4_K*>(block);
      DequantizeK4K5(b->d, b->dmin, b->scales, nullptr, b->qs, y);
      return;
    }
    case DType::kQ5_K: {
      const auto* b = static_cast<const BlockQ5_K*>(block);
      DequantizeK4K5(b->d, b->dmin, b->scales, b->qh, b->qs, y);
      return;
    }
    case DType::kQ6_K: {
      const auto* b = static_cast<const BlockQ6_K*>(block);
      const float d = F16ToF32(b->d);
      for (int half = 0; half < 2; ++half) {
        const uint8_t* ql = b->ql + half * 64;
        const uint8_t* qh = b->qh + half * 32;
        const int8_t* sc = b->scales + half * 8;
        float* out = y + half * 128;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          out[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
          out[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
          out[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
          out[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
      }
      return;
    }
    default:
      DequantizeRow(t, block, y, BlockSize(t));
      return;
  }
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kQ5_0:
      return "Q5_0";
    case DType::kQ5_1:
      return "Q5_1";
    case DType::kQ4_K:
      return "Q4_K";
    case DType::kQ5_K:
      return "Q5_K";
    case DType::kQ6_K:
      return "Q6_K";
  }
  return "?";
}

int64_t BlockSize(DType t) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return kQK;
    default:
      return 1;
  }
}

int64_t BlockBytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kQ8_0:
      return sizeof(BlockQ8_0);
    case DType::kQ4_0:
      return sizeof(BlockQ4_0);
    case DType::kQ4_1:
      return sizeof(BlockQ4_1);
    case DType::kQ5_0:
      return sizeof(BlockQ5_0);
    case DType::kQ5_1:
      return sizeof(BlockQ5_1);
    case DType::kQ4_K:
      return sizeof(BlockQ4_K);
    case DType::kQ5_K:
      return sizeof(BlockQ5_K);
    case DType::kQ6_K:
      return sizeof(BlockQ6_K);
  }
  return 0;
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  // _cvtss_sh rounds to nearest even and handles overflow, NaN and subnormals.
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

float BF16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000)
    return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

void F32ToF16Row(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = F32ToF16(src[i]);
}

void F16ToF32Row(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kF16:
      F16ToF32Row(static_cast<const uint16_t*>(src), dst, n);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t k = 0; k < n / 32; ++k, dst += 32) {
        const float d = F16ToF32(b[k].d);
        for (int j = 0; j < 32; ++j) dst[j] = d * b[k].qs[j];
      }
      return;
    }
    case DType::kQ4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t k = 0; k < n / 32; ++k, dst += 32) {
        const float d = F16ToF32(b[k].d);
        for (int j = 0; j < 16; ++j) {
          dst[j] = d * (static_cast<int>(b[k].qs[j] & 0x0f) - 8);
          dst[j + 16] = d * (static_cast<int>(b[k].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t k = 0; k < n / 32; ++k, dst += 32) {
        const float d = F16ToF32(b[k].d);
        const float m = F16ToF32(b[k].m);
        for (int j = 0; j < 16; ++j) {
          // One rounding, as the CPU kernels' fused dequantize-dot (kernels/cpu/quant_dot.h).
          dst[j] = std::fmaf(d, static_cast<float>(b[k].qs[j] & 0x0f), m);
          dst[j + 16] = std::fmaf(d, static_cast<float>(b[k].qs[j] >> 4), m);
        }
      }
      return;
    }
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: {
      const auto* b = static_cast<const uint8_t*>(src);
      const int64_t block = BlockSize(t), bytes = BlockBytes(t);
      for (int64_t k = 0; k < n / block; ++k) DequantizeBlock(t, b + k * bytes, dst + k * block);
      return;
    }
  }
}

}  // namespace riskkv
