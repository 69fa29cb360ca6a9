// What each thread of the RoPE, feature-gather, rebuilt-scatter and K/V-store kernels computes,
// as functions of the element index. They compile for the device (kernels.cu) and for the host,
// where tests/kernels/cuda_kernel_math_test.cc checks them against the CPU oracle without a GPU.
#pragma once

#include <cuda_fp16.h>
#include <math.h>

#include <cstdint>

#include "kernels/cuda/engine_api.h"

#ifdef __CUDACC__
#define RKV_HOST_DEVICE __host__ __device__
#else
#define RKV_HOST_DEVICE
#endif

namespace riskkv::cuda {

// Rotated pairs a scaled RoPE may describe (head_dim up to 256).
inline constexpr int kMaxRopePairs = 128;

struct RopeConfig {
  int64_t head_dim = 0;
  int64_t rope_dim = 0;
  double base = 10000.0;
  int interleaved = 0;
  // Scaled RoPE (RopeParams::freq_divisors and attn_factor): pair i's frequency divided by
  // divisors[i], cos and sin multiplied by attn_factor (divided, for the inverse).
  int scaled = 0;
  double attn_factor = 1.0;
  double divisors[kMaxRopePairs] = {};
};

// The rotation a model's dimensions describe.
inline RopeConfig RopeFromDims(const ModelDims& d) {
  RopeConfig r{d.head_dim, d.rope_dim, d.rope_base, d.rope_interleaved};
  if (d.rope_scaled) {
    r.scaled = 1;
    r.attn_factor = d.rope_attn_factor;
    for (int64_t i = 0; i < d.rope_dim / 2 && i < kMaxRopePairs; ++i) {
      r.divisors[i] = d.rope_divisors[i];
    }
  }
  return r;
}

// Most layers one group rebuilds, or anchors it reads, in one launch.
inline constexpr int kMaxGroupLayers = 32;

struct LayerPointers {
  __half* k[kMaxGroupLayers];
  __half* v[kMaxGroupLayers];
};

// f32 to f16, saturating at f16's largest finite value instead of overflowing to infinity (NaN
// stays NaN).
RKV_HOST_DEVICE inline __half ToHalfSat(float x) {
  return __float2half(x != x ? x : fminf(fmaxf(x, -65504.0f), 65504.0f));
}

// cos and sin of position * base^(-2i / rope_dim), as the CPU backend computes them (in double,
// rounded to f32); sin negated for the inverse rotation.
RKV_HOST_DEVICE inline void RopeAngle(double position, int64_t i, const RopeConfig& r, int inverse,
                                      float* c, float* s) {
  double inv_freq = pow(r.base, -2.0 * static_cast<double>(i) / static_cast<double>(r.rope_dim));
  double magnitude = 1.0;
  if (r.scaled) {
    inv_freq /= r.divisors[i];
    magnitude = inverse ? 1.0 / r.attn_factor : r.attn_factor;
  }
  const double angle = position * inv_freq;
  *c = static_cast<float>(magnitude * cos(angle));
  const double sn = magnitude * sin(angle);
  *s = static_cast<float>(inverse ? -sn : sn);
}

// For dimension d < rope_dim of a head: its pair index, its partner and whether it is the
// pair's first member.
RKV_HOST_DEVICE inline void RopePair(int64_t d, const RopeConfig& r, int64_t* pair,
                                     int64_t* partner, bool* first) {
  const int64_t half = r.rope_dim / 2;
  if (r.interleaved) {
    *pair = d / 2;
    *first = (d % 2) == 0;
    *partner = *first ? d + 1 : d - 1;
  } else {
    *first = d < half;
    *pair = *first ? d : d - half;
    *partner = *first ? d + half : d - half;
  }
}

// One rotated element given itself and its partner.
RKV_HOST_DEVICE inline float RotateElement(float self, float partner, bool first, float c,
                                           float s) {
  return first ? self * c - partner * s : partner * s + self * c;
}

// RoPE in place: element idx of [n, heads, rope_dim / 2] rotates one pair of x's row t (rows
// `stride` apart) by positions[t], or pos0 + t when positions is null.
RKV_HOST_DEVICE inline void RotatePairAt(float* x, int64_t stride, int64_t heads,
                                         const int32_t* positions, int64_t pos0,
                                         const RopeConfig& r, int inverse, int64_t idx) {
  const int64_t half = r.rope_dim / 2;
  const int64_t i = idx % half;
  const int64_t h = (idx / half) % heads;
  const int64_t t = idx / half / heads;
  const double position = positions != nullptr ? positions[t] : static_cast<double>(pos0 + t);
  float c, s;
  RopeAngle(position, i, r, inverse, &c, &s);
  float* v = x + t * stride + h * r.head_dim;
  const int64_t a = r.interleaved ? 2 * i : i;
  const int64_t b = r.interleaved ? 2 * i + 1 : i + half;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

// Element idx of the feature rows [count, n_anchors, {K, V}, width] for positions
// [begin, begin + count): an anchor's key with RoPE undone, or its value.
RKV_HOST_DEVICE inline float GatherFeatureAt(const LayerPointers& anchors, int n_anchors,
                                             int64_t begin, int64_t width, const RopeConfig& r,
                                             int64_t idx) {
  const int64_t j = idx % width;
  const int64_t rest = idx / width;
  const int part = static_cast<int>(rest % 2);
  const int a = static_cast<int>((rest / 2) % n_anchors);
  const int64_t t = rest / 2 / n_anchors;
  const int64_t row = (begin + t) * width;
  if (part == 1) return __half2float(anchors.v[a][row + j]);
  const __half* k = anchors.k[a] + row;
  const int64_t d = j % r.head_dim, head = j - d;
  if (d >= r.rope_dim) return __half2float(k[j]);
  int64_t pair, partner;
  bool first;
  RopePair(d, r, &pair, &partner, &first);
  float c, s;
  RopeAngle(static_cast<double>(begin + t), pair, r, /*inverse=*/1, &c, &s);
  return RotateElement(__half2float(k[j]), __half2float(k[head + partner]), first, c, s);
}

// Element idx of the rebuilt rows y [count, n_targets, {K, V}, width]: plus the bias c, keys
// rotated by RoPE at position begin + t, written as f16 into the target's cache.
RKV_HOST_DEVICE inline void ScatterRebuiltAt(const float* y, const float* c,
                                             const LayerPointers& targets, int n_targets,
                                             int64_t begin, int64_t width, const RopeConfig& r,
                                             int64_t idx) {
  const int64_t j = idx % width;
  const int64_t rest = idx / width;
  const int part = static_cast<int>(rest % 2);
  const int tgt = static_cast<int>((rest / 2) % n_targets);
  const int64_t t = rest / 2 / n_targets;
  const int64_t block = (static_cast<int64_t>(tgt) * 2 + part) * width;  // into c
  const int64_t out = (begin + t) * width + j;
  const float self = y[idx] + c[block + j];
  if (part == 1) {
    targets.v[tgt][out] = ToHalfSat(self);
    return;
  }
  const int64_t d = j % r.head_dim, head = j - d;
  if (d >= r.rope_dim) {
    targets.k[tgt][out] = ToHalfSat(self);
    return;
  }
  int64_t pair, partner;
  bool first;
  RopePair(d, r, &pair, &partner, &first);
  const float other = y[idx - j + head + partner] + c[block + head + partner];
  float cs, sn;
  RopeAngle(static_cast<double>(begin + t), pair, r, /*inverse=*/0, &cs, &sn);
  targets.k[tgt][out] = ToHalfSat(RotateElement(self, other, first, cs, sn));
}

// Element idx of [n, {K, V}, width]: row i's K and V (V `width` after K in each source row,
// rows `stride` apart) into the dense f16 caches k and v.
RKV_HOST_DEVICE inline void StoreKvAt(const float* src, int64_t width, int64_t stride, __half* k,
                                      __half* v, int64_t idx) {
  const int64_t i = idx / (2 * width), j = idx % (2 * width);
  const __half h = ToHalfSat(src[i * stride + j]);
  if (j < width) {
    k[i * width + j] = h;
  } else {
    v[i * width + j - width] = h;
  }
}

}  // namespace riskkv::cuda
