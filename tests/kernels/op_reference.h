// Naive scalar references for the backend ops and ggml-layout quantizers, written for clarity
// rather than speed; every backend is compared against these and against each other.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace riskkv::testing {

inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline void PutHalf(std::vector<uint8_t>& out, float v) {
  const uint16_t h = F32ToF16(v);
  out.push_back(h & 0xff);
  out.push_back(h >> 8);
}

// The little-endian f16 at p as a float.
inline float GetHalf(const uint8_t* p) { return F16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// round((x - lo) / scale) clipped to [0, levels]; 0 where the scale is 0.
inline int Level(float x, float lo, float scale, int levels) {
  if (scale == 0.0f) return 0;
  return static_cast<int>(
      std::clamp(std::nearbyint((x - lo) / scale), 0.0f, static_cast<float>(levels)));
}

// Q4_K (bits 4) or Q5_K (bits 5) super-block of 256 values: min/max per sub-block of 32, 6-bit
// scales and mins relative to f16 super-block scales, packed as ggml packs them.
inline void PutK4K5(std::vector<uint8_t>& out, const float* x, int bits) {
  const int levels = (1 << bits) - 1;
  float scale[8], minus[8], dmax = 0, mmax = 0;
  for (int g = 0; g < 8; ++g) {
    float lo = 0, hi = x[g * 32];
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, x[g * 32 + l]);
      hi = std::max(hi, x[g * 32 + l]);
    }
    scale[g] = (hi - lo) / levels;
    minus[g] = -lo;
    dmax = std::max(dmax, scale[g]);
    mmax = std::max(mmax, minus[g]);
  }
  const float d = F16ToF32(F32ToF16(dmax / 63)), dmin = F16ToF32(F32ToF16(mmax / 63));
  int sc[8], m[8], q[256];
  for (int g = 0; g < 8; ++g) {
    sc[g] = Level(scale[g], 0, d, 63);
    m[g] = Level(minus[g], 0, dmin, 63);
    const float ds = d * static_cast<float>(sc[g]), dm = dmin * static_cast<float>(m[g]);
    for (int l = 0; l < 32; ++l) q[g * 32 + l] = Level(x[g * 32 + l], -dm, ds, levels);
  }
  PutHalf(out, d);
  PutHalf(out, dmin);
  for (int j = 0; j < 4; ++j) out.push_back(static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6)));
  for (int j = 0; j < 4; ++j) out.push_back(static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6)));
  for (int j = 0; j < 4; ++j) {
    out.push_back(static_cast<uint8_t>((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4)));
  }
  if (bits == 5) {
    for (int l = 0; l < 32; ++l) {
      uint8_t h = 0;
      for (int g = 0; g < 8; ++g) h |= static_cast<uint8_t>(((q[g * 32 + l] >> 4) & 1) << g);
      out.push_back(h);
    }
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      out.push_back(
          static_cast<uint8_t>((q[2 * c * 32 + l] & 0xf) | ((q[(2 * c + 1) * 32 + l] & 0xf) << 4)));
    }
  }
}

// Q6_K super-block: 16 sub-blocks of 16 with int8 scales, 6-bit values split into low nibbles
// (ql) and high pairs (qh), as ggml lays them out.
inline void PutQ6K(std::vector<uint8_t>& out, const float* x) {
  float amax[16], top = 0;
  for (int g = 0; g < 16; ++g) {
    amax[g] = 0;
    for (int l = 0; l < 16; ++l) amax[g] = std::max(amax[g], std::fabs(x[g * 16 + l]));
    top = std::max(top, amax[g]);
  }
  const float d = F16ToF32(F32ToF16(top / (32 * 127)));
  int sc[16], q[256];
  for (int g = 0; g < 16; ++g) {
    sc[g] = Level(amax[g] / 32, 0, d, 127);
    const float step = d * static_cast<float>(sc[g]);
    for (int l = 0; l < 16; ++l) q[g * 16 + l] = Level(x[g * 16 + l], -32 * step, step, 63);
  }
  uint8_t ql[128], qh[64];
  for (int half = 0; half < 2; ++half) {
    const int* v = q + half * 128;
    for (int l = 0; l < 32; ++l) {
      ql[half * 64 + l] = static_cast<uint8_t>((v[l] & 0xf) | ((v[l + 64] & 0xf) << 4));
      ql[half * 64 + 32 + l] = static_cast<uint8_t>((v[l + 32] & 0xf) | ((v[l + 96] & 0xf) << 4));
      qh[half * 32 + l] = static_cast<uint8_t>((v[l] >> 4) | ((v[l + 32] >> 4) << 2) |
                                               ((v[l + 64] >> 4) << 4) | ((v[l + 96] >> 4) << 6));
    }
  }
  out.insert(out.end(), ql, ql + 128);
  out.insert(out.end(), qh, qh + 64);
  for (int g = 0; g < 16; ++g) out.push_back(static_cast<uint8_t>(static_cast<int8_t>(sc[g])));
  PutHalf(out, d);
}

// Q5_0 (d * (q - 16)) or Q5_1 (d * q + m) block of 32.
inline void PutQ5(std::vector<uint8_t>& out, const float* x, bool offset) {
  float lo = x[0], hi = x[0], amax = 0;
  for (int j = 0; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  const float d = F16ToF32(F32ToF16(offset ? (hi - lo) / 31 : amax / 15));
  const float m = F16ToF32(F32ToF16(lo));
  int q[32];
  uint32_t qh = 0;
  for (int j = 0; j < 32; ++j) {
    q[j] = offset ? Level(x[j], m, d, 31) : Level(x[j], -16 * d, d, 31);
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
  }
  PutHalf(out, d);
  if (offset) PutHalf(out, m);
  for (int b = 0; b < 4; ++b) out.push_back(static_cast<uint8_t>(qh >> (8 * b)));
  for (int j = 0; j < 16; ++j)
    out.push_back(static_cast<uint8_t>((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4)));
}

// Quantizes a row of n values (n a multiple of BlockSize(t)) into the ggml block layout.
inline std::vector<uint8_t> QuantizeRow(DType t, const float* x, int64_t n) {
  std::vector<uint8_t> out;
  switch (t) {
    case DType::kQ4_K:
    case DType::kQ5_K:
      for (int64_t b = 0; b < n; b += 256) PutK4K5(out, x + b, t == DType::kQ4_K ? 4 : 5);
      break;
    case DType::kQ6_K:
      for (int64_t b = 0; b < n; b += 256) PutQ6K(out, x + b);
      break;
    case DType::kQ5_0:
    case DType::kQ5_1:
      for (int64_t b = 0; b < n; b += 32) PutQ5(out, x + b, t == DType::kQ5_1);
      break;
    case DType::kF32:
      out.resize(n * 4);
      std::memcpy(out.data(), x, n * 4);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) PutHalf(out, x[i]);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = F32ToBF16(x[i]);
        out.push_back(h & 0xff);
        out.push_back(h >> 8);
      }
      break;
    case DType::kQ8_0:
      for (int64_t b = 0; b < n; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
        const float d = amax / 127.0f;
        PutHalf(out, d);
        for (int j = 0; j < 32; ++j) {
          out.push_back(
              static_cast<uint8_t>(static_cast<int8_t>(d ? std::lround(x[b + j] / d) : 0)));
        }
      }
      break;
    case DType::kQ4_0:
      for (int64_t b = 0; b < n; b += 32) {
        float amax = 0, maxv = 0;
        for (int j = 0; j < 32; ++j) {
          if (std::fabs(x[b + j]) > amax) {
            amax = std::fabs(x[b + j]);
            maxv = x[b + j];
          }
        }
        const float d = maxv / -8.0f;
        const float id = d ? 1.0f / d : 0.0f;
        PutHalf(out, d);
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, static_cast<int>(x[b + j] * id + 8.5f));
          const int q1 = std::min(15, static_cast<int>(x[b + j + 16] * id + 8.5f));
          out.push_back(static_cast<uint8_t>(q0 | (q1 << 4)));
        }
      }
      break;
    case DType::kQ4_1:
      for (int64_t b = 0; b < n; b += 32) {
        float mn = x[b], mx = x[b];
        for (int j = 0; j < 32; ++j) {
          mn = std::min(mn, x[b + j]);
          mx = std::max(mx, x[b + j]);
        }
        const float d = (mx - mn) / 15.0f;
        const float id = d ? 1.0f / d : 0.0f;
        PutHalf(out, d);
        PutHalf(out, mn);
        for (int j = 0; j < 16; ++j) {
          const int q0 = std::min(15, static_cast<int>((x[b + j] - mn) * id + 0.5f));
          const int q1 = std::min(15, static_cast<int>((x[b + j + 16] - mn) * id + 0.5f));
          out.push_back(static_cast<uint8_t>(q0 | (q1 << 4)));
        }
      }
      break;
  }
  return out;
}

// n_rows rows of type t (quantized) whose code bytes are random, so every code value, sub-block
// scale and min occurs, and whose f16 scales are finite, of both signs and magnitudes 0.001-0.1.
inline std::vector<uint8_t> RandomBlocks(DType t, int64_t n_rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n_rows * RowBytes(t, cols));
  for (uint8_t& byte : out) byte = static_cast<uint8_t>(rng());
  std::vector<int> halves;  // offsets of a block's f16 scales
  switch (t) {
    case DType::kQ4_1:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
      halves = {0, 2};
      break;
    case DType::kQ6_K:
      halves = {208};
      break;
    default:
      halves = {0};
  }
  std::uniform_real_distribution<float> magnitude(0.001f, 0.1f);
  for (size_t b = 0; b < out.size(); b += BlockBytes(t)) {
    for (const int at : halves) {
      const float v = (rng() % 2 ? -1.0f : 1.0f) * magnitude(rng);
      const uint16_t h = F32ToF16(v);
      std::memcpy(out.data() + b + at, &h, 2);
    }
  }
  return out;
}

// Normalised mean squared error, as in ggml's test-backend-ops.
inline double Nmse(const float* a, const float* ref, int64_t n) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0 ? err / norm : err;
}

}  // namespace riskkv::testing
