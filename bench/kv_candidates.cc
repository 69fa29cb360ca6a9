// Candidate KV quantizers (see kv_candidates.h).
#include "bench/kv_candidates.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/kvcodec/kv_codec.h"

namespace riskkv::bench {
namespace {

// Normalised Walsh-Hadamard transform of x[0, n), n a power of two; its own inverse.
void Hadamard(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float s = 1.0f / std::sqrt(static_cast<float>(n));
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void RotateRows(float* rows, int64_t n, int64_t heads, int64_t dim) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < heads; ++h) Hadamard(rows + (t * heads + h) * dim, dim);
  }
}

int Bits(const Candidate& c, bool values) {
  return values && c.value_bits > 0 ? c.value_bits : c.bits;
}

QuantScheme Scheme(const Candidate& c, bool values) {
  return {.bits = Bits(c, values),
          .with_min = c.with_min,
          .param_dtype = c.param_dtype,
          .fit_range = c.fit_range};
}

void PerChannel(const QuantScheme& s, float* rows, int64_t n, int64_t width, int64_t group) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * width));
  for (int64_t t = 0; t < n; t += group) {
    const int64_t m = std::min(group, n - t);
    for (int64_t ch = 0; ch < width; ++ch) {
      const int64_t o = t * width + ch;
      const GroupParams p = QuantizeGroup(s, rows + o, m, width, codes.data() + o);
      DequantizeGroup(s, p, codes.data() + o, m, width, rows + o);
    }
  }
}

void PerToken(const QuantScheme& s, float* rows, int64_t n, int64_t width, int64_t group) {
  std::vector<uint8_t> codes(static_cast<size_t>(group));
  for (int64_t o = 0; o < n * width; o += group) {
    const GroupParams p = QuantizeGroup(s, rows + o, group, 1, codes.data());
    DequantizeGroup(s, p, codes.data(), group, 1, rows + o);
  }
}

}  // namespace

std::vector<Candidate> Candidates() {
  std::vector<Candidate> out;
  out.push_back({.name = "int8", .bits = 8});
  out.push_back({.name = "int4", .bits = 4});
  out.push_back({.name = "int4, sink row in f16", .bits = 4, .sink = 1});
  out.push_back({.name = "int4, sink row in f16, least-squares ranges",
                 .bits = 4,
                 .fit_range = true,
                 .sink = 1});
  out.push_back({.name = "int4, sink row, least-squares ranges, values in groups of 32",
                 .bits = 4,
                 .fit_range = true,
                 .value_group = 32,
                 .sink = 1});
  out.push_back({.name = "int8, sink row in f16, least-squares ranges",
                 .bits = 8,
                 .fit_range = true,
                 .sink = 1});
  out.push_back(
      {.name = "int4, sink row and last 32 rows in f16", .bits = 4, .sink = 1, .recent = 32});
  out.push_back(
      {.name = "int4, sink row, values in groups of 32", .bits = 4, .value_group = 32, .sink = 1});
  out.push_back(
      {.name = "int4, sink row, keys over 16-token groups", .bits = 4, .key_group = 16, .sink = 1});
  out.push_back(
      {.name = "int4, sink row, keys over 64-token groups", .bits = 4, .key_group = 64, .sink = 1});
  out.push_back({.name = "int4, sink row, both finer",
                 .bits = 4,
                 .key_group = 16,
                 .value_group = 32,
                 .sink = 1});
  out.push_back({.name = "int4, sink row, values Hadamard-rotated per head",
                 .bits = 4,
                 .rotate_values = true,
                 .sink = 1});
  out.push_back({.name = "int4, sink row, keys Hadamard-rotated per head",
                 .bits = 4,
                 .rotate_keys = true,
                 .sink = 1});
  out.push_back({.name = "int4, sink row, values per channel like keys",
                 .bits = 4,
                 .value_per_channel = true,
                 .sink = 1});
  out.push_back(
      {.name = "int4, sink row, keys pre-RoPE", .bits = 4, .sink = 1, .pre_rope_keys = true});
  out.push_back({.name = "int4, sink row, keys pre-RoPE over 64-token groups",
                 .bits = 4,
                 .key_group = 64,
                 .sink = 1,
                 .pre_rope_keys = true});
  out.push_back(
      {.name = "int8, sink row, keys pre-RoPE", .bits = 8, .sink = 1, .pre_rope_keys = true});
  out.push_back(
      {.name = "3-bit, sink row, keys pre-RoPE", .bits = 3, .sink = 1, .pre_rope_keys = true});
  out.push_back({.name = "3-bit, sink row", .bits = 3, .sink = 1});
  out.push_back({.name = "keys 4-bit pre-RoPE, values 3-bit, sink row",
                 .bits = 4,
                 .value_bits = 3,
                 .sink = 1,
                 .pre_rope_keys = true});
  out.push_back({.name = "keys 3-bit pre-RoPE, values 4-bit, sink row",
                 .bits = 3,
                 .value_bits = 4,
                 .sink = 1,
                 .pre_rope_keys = true});
  return out;
}

void Apply(const Candidate& c, bool values, float* rows, int64_t n, int64_t heads, int64_t dim,
           const KeyRope* rope) {
  const int64_t width = heads * dim;
  const int64_t first = std::min(c.sink, n), last = std::max(first, n - c.recent);
  float* x = rows + first * width;
  const int64_t m = last - first;
  if (m <= 0) return;
  const QuantScheme s = Scheme(c, values);
  const bool unrope = !values && c.pre_rope_keys;
  std::vector<int32_t> positions;
  if (unrope) {
    if (rope == nullptr || rope->backend == nullptr) {
      std::fprintf(stderr, "candidate %s needs the model's RoPE\n", c.name.c_str());
      std::abort();
    }
    positions.resize(static_cast<size_t>(m));
    for (int64_t i = 0; i < m; ++i) positions[i] = static_cast<int32_t>(first + i);
    rope->backend->Rope(x, m, heads, positions.data(), rope->params, /*inverse=*/true);
  }
  const bool rotate = values ? c.rotate_values : c.rotate_keys;
  if (rotate) RotateRows(x, m, heads, dim);
  if (!values || c.value_per_channel) {
    PerChannel(s, x, m, width, c.key_group);
  } else {
    PerToken(s, x, m, width, c.value_group);
  }
  if (rotate) RotateRows(x, m, heads, dim);
  if (unrope) rope->backend->Rope(x, m, heads, positions.data(), rope->params, /*inverse=*/false);
}

double Bytes(const Candidate& c, bool values, int64_t n, int64_t heads, int64_t dim) {
  const int64_t width = heads * dim;
  const int64_t exact = std::min(n, c.sink + c.recent), m = n - exact;
  const double params = static_cast<double>(ParamBytes(Scheme(c, values)));
  double b = 2.0 * static_cast<double>(exact * width) +
             Bits(c, values) / 8.0 * static_cast<double>(m * width);
  if (!values || c.value_per_channel) {
    b += params * static_cast<double>(width) * std::ceil(static_cast<double>(m) / c.key_group);
  } else {
    b += params * static_cast<double>(m * width / c.value_group);
  }
  return b;
}

}  // namespace riskkv::bench
