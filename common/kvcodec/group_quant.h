// Quantization of one group of values (a key channel over a token group, or one token's head of
// values) to 8- or 4-bit codes with a scale, and a min for the asymmetric schemes. The wire
// forms (kv_codec.h) are built from these; the measurement that chose their schemes
// (bench/kv_wire_bench.cc) compares every candidate through the same code.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace riskkv {

struct QuantScheme {
  int bits = 8;  // 8 or 4 on the wire (the candidate bench also measures 3)
  // false: symmetric, x = d * (u - z) with z = 2^(bits-1) and u in [1, 2^bits - 1] (zero is
  // exact); true: x = m + d * u with u in [0, 2^bits - 1].
  bool with_min = false;
  DType param_dtype = DType::kF16;  // of d and m: kF16 or kF32
  // Encoder only (the codes and parameters decode as any others): with_min groups take the (m, d)
  // of least squared error among min-max and nearby ranges, each refitted to its codes by least
  // squares, instead of min-max alone. Outliers may then be clipped. A candidate the wire forms do
  // not use: it lowers the NRMSE and raises the ΔNLL (docs/services.md, "The wire forms").
  bool fit_range = false;

  bool operator==(const QuantScheme&) const = default;
};

// Bytes of a group's parameters (d, and m when with_min).
int64_t ParamBytes(const QuantScheme& s);
// The largest magnitude the scheme represents: inputs are clamped to [-limit, limit] (65504 with
// f16 parameters, the f16 range; 8e37 with f32, so that m + d * u cannot overflow).
float InputLimit(const QuantScheme& s);

// A group's parameters as stored (already rounded to param_dtype).
struct GroupParams {
  float scale = 0;  // d >= 0
  float min = 0;    // m (0 when !with_min)
};

// Quantizes x[i * stride], i < n (n >= 1), into codes[i * stride] (one code per byte). NaN counts
// as 0 and values beyond InputLimit are clamped. Without fit_range the stored d is rounded up and m
// down, so every decoded value lies within d / 2 of its clamped input (up to f32 rounding;
// near InputLimit d is rounded down instead, so no value decodes beyond it); with it, the group's
// squared error is at most min-max's.
GroupParams QuantizeGroup(const QuantScheme& s, const float* x, int64_t n, int64_t stride,
                          uint8_t* codes);

// The inverse: out[i * stride] from codes[i * stride].
void DequantizeGroup(const QuantScheme& s, GroupParams p, const uint8_t* codes, int64_t n,
                     int64_t stride, float* out);

// Writes/reads p as ParamBytes(s) little-endian bytes.
void StoreParams(const QuantScheme& s, GroupParams p, uint8_t* out);
GroupParams LoadParams(const QuantScheme& s, const uint8_t* in);

// Whether a loaded group can be decoded: d and m finite, d >= 0, and every decoded value within
// [-InputLimit, InputLimit] (with f16 parameters the f16 range, so that an f16 cache holds it).
// QuantizeGroup's parameters always are.
bool ParamsValid(const QuantScheme& s, GroupParams p);
// Whether u is a code the scheme produces (the symmetric schemes never write 0).
inline bool CodeValid(const QuantScheme& s, uint8_t u) { return s.with_min || u != 0; }

}  // namespace riskkv
