// Group quantization (see group_quant.h).
#include "common/kvcodec/group_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace riskkv {
namespace {

constexpr float kF16Max = 65504.0f;

int MaxCode(const QuantScheme& s) { return (1 << s.bits) - 1; }
int ZeroPoint(const QuantScheme& s) { return 1 << (s.bits - 1); }

// f16 bit patterns one step toward +inf / -inf (finite inputs within the f16 range).
uint16_t F16Up(uint16_t h) {
  if (h == 0x8000) return 0x0001;
  return (h & 0x8000) ? h - 1 : h + 1;
}
uint16_t F16Down(uint16_t h) {
  if (h == 0x0000) return 0x8001;
  return (h & 0x8000) ? h + 1 : h - 1;
}

// `v` stored in the parameter dtype, rounded toward +inf (up) or -inf.
float RoundParam(DType t, double v, bool up) {
  if (t == DType::kF16) {
    uint16_t h = F32ToF16(static_cast<float>(v));
    if (up && F16ToF32(h) < v) h = F16Up(h);
    if (!up && F16ToF32(h) > v) h = F16Down(h);
    return F16ToF32(h);
  }
  float f = static_cast<float>(v);
  if (up && f < v) f = std::nextafter(f, std::numeric_limits<float>::infinity());
  if (!up && f > v) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}

// The next value below v > 0 in the parameter dtype.
float StepDown(DType t, float v) {
  if (t == DType::kF16) return F16ToF32(F16Down(F32ToF16(v)));
  return std::nextafter(v, 0.0f);
}

float RoundNearest(DType t, double v) {
  return t == DType::kF16 ? F16ToF32(F32ToF16(static_cast<float>(v))) : static_cast<float>(v);
}

float Clamp(const QuantScheme& s, float v) {
  if (std::isnan(v)) return 0.0f;
  const float lim = InputLimit(s);
  return std::clamp(v, -lim, lim);
}

// Codes of x under (m, d), the nearest in [0, qmax], and their squared error.
double NearestCodes(const QuantScheme& s, GroupParams p, const float* x, int64_t n, int64_t stride,
                    uint8_t* codes) {
  const int qmax = MaxCode(s);
  const float inv = p.scale > 0 ? 1.0f / p.scale : 0.0f;
  double err = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = Clamp(s, x[i * stride]);
    const float q = std::clamp(std::nearbyint((v - p.min) * inv), 0.0f, static_cast<float>(qmax));
    codes[i * stride] = static_cast<uint8_t>(q);
    const double e = static_cast<double>(v) - (p.min + p.scale * q);
    err += e * e;
  }
  return err;
}

// fit_range: min-max's (m, d) against the ranges [lo, lo + qmax / t] for t within a code of
// qmax / (hi - lo), each refitted by least squares to the codes it gives; the least error wins.
GroupParams FitRange(const QuantScheme& s, GroupParams minmax, double lo, double hi, const float* x,
                     int64_t n, int64_t stride, uint8_t* codes) {
  const int qmax = MaxCode(s);
  double best = NearestCodes(s, minmax, x, n, stride, codes);
  GroupParams winner = minmax;
  if (hi <= lo || n < 2) return winner;
  for (int step = -8; step <= 16; ++step) {
    const double iscale = (qmax + 0.0625 * step) / (hi - lo);
    double su = 0, suu = 0, sx = 0, sxu = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = Clamp(s, x[i * stride]);
      const double u = std::clamp(std::nearbyint((v - lo) * iscale), 0.0, double(qmax));
      su += u;
      suu += u * u;
      sx += v;
      sxu += v * u;
    }
    const double det = n * suu - su * su;
    if (det <= 0) continue;
    const double d = (n * sxu - su * sx) / det;
    if (!(d > 0)) continue;
    const double m = (sx - d * su) / n;
    GroupParams p{.scale = RoundNearest(s.param_dtype, d), .min = RoundNearest(s.param_dtype, m)};
    if (!(p.scale > 0) || !ParamsValid(s, p)) continue;
    thread_local std::vector<uint8_t> trial;
    trial.resize(static_cast<size_t>(n * stride));
    const double err = NearestCodes(s, p, x, n, stride, trial.data());
    if (err < best) {
      best = err;
      winner = p;
    }
  }
  if (winner.scale != minmax.scale || winner.min != minmax.min) {
    NearestCodes(s, winner, x, n, stride, codes);
  }
  return winner;
}

}  // namespace

int64_t ParamBytes(const QuantScheme& s) {
  const int64_t one = s.param_dtype == DType::kF16 ? 2 : 4;
  return s.with_min ? 2 * one : one;
}

float InputLimit(const QuantScheme& s) { return s.param_dtype == DType::kF16 ? kF16Max : 8e37f; }

GroupParams QuantizeGroup(const QuantScheme& s, const float* x, int64_t n, int64_t stride,
                          uint8_t* codes) {
  double lo = Clamp(s, x[0]), hi = lo;
  for (int64_t i = 1; i < n; ++i) {
    const double v = Clamp(s, x[i * stride]);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  GroupParams p;
  const int qmax = MaxCode(s);
  if (s.with_min) {
    p.min = RoundParam(s.param_dtype, lo, /*up=*/false);
    p.scale = RoundParam(s.param_dtype, (hi - p.min) / qmax, /*up=*/true);
    // Rounding d up must not carry the top code past the range (an f16 cache would hold inf).
    while (p.scale > 0 && p.min + static_cast<double>(p.scale) * qmax > InputLimit(s)) {
      p.scale = StepDown(s.param_dtype, p.scale);
    }
    if (s.fit_range) return FitRange(s, p, lo, hi, x, n, stride, codes);
    const float inv = p.scale > 0 ? 1.0f / p.scale : 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float q = std::nearbyint((Clamp(s, x[i * stride]) - p.min) * inv);
      codes[i * stride] = static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(qmax)));
    }
    return p;
  }
  const int z = ZeroPoint(s), qs = z - 1;
  const double absmax = std::max(-lo, hi);
  p.scale = RoundParam(s.param_dtype, absmax / qs, /*up=*/true);
  while (p.scale > 0 && static_cast<double>(p.scale) * qs > InputLimit(s)) {
    p.scale = StepDown(s.param_dtype, p.scale);
  }
  const float inv = p.scale > 0 ? 1.0f / p.scale : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float q = std::nearbyint(Clamp(s, x[i * stride]) * inv);
    codes[i * stride] = static_cast<uint8_t>(
        z + static_cast<int>(std::clamp(q, -static_cast<float>(qs), static_cast<float>(qs))));
  }
  return p;
}

void DequantizeGroup(const QuantScheme& s, GroupParams p, const uint8_t* codes, int64_t n,
                     int64_t stride, float* out) {
  if (s.with_min) {
    for (int64_t i = 0; i < n; ++i) {
      out[i * stride] = p.min + p.scale * static_cast<float>(codes[i * stride]);
    }
    return;
  }
  const int z = ZeroPoint(s);
  for (int64_t i = 0; i < n; ++i) {
    out[i * stride] = p.scale * static_cast<float>(static_cast<int>(codes[i * stride]) - z);
  }
}

void StoreParams(const QuantScheme& s, GroupParams p, uint8_t* out) {
  if (s.param_dtype == DType::kF16) {
    const uint16_t d = F32ToF16(p.scale), m = F32ToF16(p.min);
    out[0] = static_cast<uint8_t>(d);
    out[1] = static_cast<uint8_t>(d >> 8);
    if (s.with_min) {
      out[2] = static_cast<uint8_t>(m);
      out[3] = static_cast<uint8_t>(m >> 8);
    }
    return;
  }
  std::memcpy(out, &p.scale, 4);  // little-endian hosts only (x86-64, as the kernels)
  if (s.with_min) std::memcpy(out + 4, &p.min, 4);
}

GroupParams LoadParams(const QuantScheme& s, const uint8_t* in) {
  GroupParams p;
  if (s.param_dtype == DType::kF16) {
    p.scale = F16ToF32(static_cast<uint16_t>(in[0] | in[1] << 8));
    if (s.with_min) p.min = F16ToF32(static_cast<uint16_t>(in[2] | in[3] << 8));
    return p;
  }
  std::memcpy(&p.scale, in, 4);
  if (s.with_min) std::memcpy(&p.min, in + 4, 4);
  return p;
}

bool ParamsValid(const QuantScheme& s, GroupParams p) {
  if (!std::isfinite(p.scale) || !std::isfinite(p.min) || p.scale < 0) return false;
  const double lim = InputLimit(s), d = p.scale, m = p.min;
  if (!s.with_min) return d * (ZeroPoint(s) - 1) <= lim;
  return m >= -lim && m + d * MaxCode(s) <= lim;
}

}  // namespace riskkv
