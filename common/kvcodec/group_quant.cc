// Group quantization (see group_quant.h).
#include "common/kvcodec/group_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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

float Clamp(const QuantScheme& s, float v) {
  if (std::isnan(v)) return 0.0f;
  const float lim = InputLimit(s);
  return std::clamp(v, -lim, lim);
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
  const double reach =
      s.with_min ? std::fabs(static_cast<double>(p.min)) + static_cast<double>(p.scale) * MaxCode(s)
                 : static_cast<double>(p.scale) * (ZeroPoint(s) - 1);
  return reach <= std::numeric_limits<float>::max();
}

}  // namespace riskkv
