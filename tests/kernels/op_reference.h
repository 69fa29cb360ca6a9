// Naive scalar references for the backend ops and ggml-layout quantizers, written for clarity
// rather than speed; every backend is compared against these and against each other.
#pragma once

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

// Quantizes a row of n values (n % 32 == 0 for block types) into the ggml block layout.
inline std::vector<uint8_t> QuantizeRow(DType t, const float* x, int64_t n) {
  std::vector<uint8_t> out;
  switch (t) {
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
