// The KV wire forms (see kv_codec.h).
#include "common/kvcodec/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

int64_t CodeBytes(int bits, int64_t n) { return bits == 8 ? n : (n + 1) / 2; }

int64_t PlainBytes(DType t) { return t == DType::kF16 ? 2 : 4; }

// The end of the token group that holds token t, clipped to `end`.
int64_t GroupEnd(int64_t t, int64_t end) {
  return std::min(end, (t / kTokenGroup + 1) * kTokenGroup);
}

void Pack(int bits, const uint8_t* codes, int64_t n, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, codes, static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i + 1 < n; i += 2) {
    out[i / 2] = static_cast<uint8_t>(codes[i] | codes[i + 1] << 4);
  }
  if (n % 2) out[n / 2] = codes[n - 1];
}

// False when padding is not zero.
bool Unpack(int bits, const uint8_t* in, int64_t n, uint8_t* codes) {
  if (bits == 8) {
    std::memcpy(codes, in, static_cast<size_t>(n));
    return true;
  }
  for (int64_t i = 0; i + 1 < n; i += 2) {
    codes[i] = in[i / 2] & 0x0f;
    codes[i + 1] = in[i / 2] >> 4;
  }
  if (n % 2) {
    codes[n - 1] = in[n / 2] & 0x0f;
    return (in[n / 2] >> 4) == 0;
  }
  return true;
}

// The first code the scheme never writes, or -1.
int64_t FirstBadCode(const QuantScheme& s, const uint8_t* codes, int64_t n) {
  if (s.with_min) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!CodeValid(s, codes[i])) return i;
  }
  return -1;
}

// Rows of [first_token, first_token + count) that cross in f16 ahead of the codes.
int64_t SinkRows(int64_t first_token, int64_t count) {
  return std::clamp<int64_t>(kSinkTokens - first_token, 0, count);
}

// Bytes of the quantized rows (those after the sink rows).
int64_t QuantizedBytes(const QuantScheme& s, bool values, int64_t first_token, int64_t count,
                       int64_t kv_heads, int64_t head_dim) {
  if (count <= 0) return 0;
  const int64_t c = kv_heads * head_dim;
  if (values) return count * (kv_heads * ParamBytes(s) + CodeBytes(s.bits, c));
  int64_t bytes = 0;
  for (int64_t t = first_token, end = first_token + count; t < end; t = GroupEnd(t, end)) {
    bytes += c * ParamBytes(s) + CodeBytes(s.bits, (GroupEnd(t, end) - t) * c);
  }
  return bytes;
}

std::string Describe(WireForm form, bool values) {
  return std::string(WireFormName(form)) + (values ? " values" : " keys");
}

}  // namespace

QuantScheme WireScheme(WireForm form, bool values) {
  const int bits = form == WireForm::kInt4 ? 4 : 8;
  return {.bits = bits, .with_min = true, .param_dtype = DType::kF16};
}

int64_t EncodedBytes(WireForm form, bool values, int64_t first_token, int64_t count,
                     int64_t kv_heads, int64_t head_dim, DType plain_dtype) {
  if (count <= 0 || form == WireForm::kTransform) return 0;
  const int64_t c = kv_heads * head_dim;
  if (form == WireForm::kPlain) return count * c * PlainBytes(plain_dtype);
  const int64_t sink = SinkRows(first_token, count);
  return sink * c * 2 + QuantizedBytes(WireScheme(form, values), values, first_token + sink,
                                       count - sink, kv_heads, head_dim);
}

int64_t LayerWireBytes(WireForm form, int64_t history, int64_t kv_heads, int64_t head_dim,
                       DType plain_dtype) {
  return EncodedBytes(form, false, 0, history, kv_heads, head_dim, plain_dtype) +
         EncodedBytes(form, true, 0, history, kv_heads, head_dim, plain_dtype);
}

void Encode(WireForm form, bool values, const float* rows, int64_t first_token, int64_t count,
            int64_t kv_heads, int64_t head_dim, std::string* out, DType plain_dtype) {
  const int64_t c = kv_heads * head_dim;
  out->assign(static_cast<size_t>(
                  EncodedBytes(form, values, first_token, count, kv_heads, head_dim, plain_dtype)),
              '\0');
  auto* p = reinterpret_cast<uint8_t*>(out->data());
  if (count <= 0 || form == WireForm::kTransform) return;
  if (form == WireForm::kPlain) {
    if (plain_dtype == DType::kF16) {
      F32ToF16Row(rows, reinterpret_cast<uint16_t*>(p), count * c);
    } else {
      std::memcpy(p, rows, static_cast<size_t>(count * c * 4));
    }
    return;
  }
  const int64_t sink = SinkRows(first_token, count);
  if (sink > 0) {
    const float lim = InputLimit({.param_dtype = DType::kF16});  // the f16 range
    std::vector<float> clamped(rows, rows + sink * c);
    for (float& v : clamped) v = std::isnan(v) ? 0.0f : std::clamp(v, -lim, lim);
    F32ToF16Row(clamped.data(), reinterpret_cast<uint16_t*>(p), sink * c);
    p += sink * c * 2;
    rows += sink * c;
    first_token += sink;
    count -= sink;
  }
  const QuantScheme s = WireScheme(form, values);
  const int64_t pb = ParamBytes(s);
  std::vector<uint8_t> codes;
  if (values) {
    codes.resize(static_cast<size_t>(c));
    for (int64_t t = 0; t < count; ++t) {
      const float* x = rows + t * c;
      for (int64_t h = 0; h < kv_heads; ++h) {
        StoreParams(s, QuantizeGroup(s, x + h * head_dim, head_dim, 1, codes.data() + h * head_dim),
                    p + h * pb);
      }
      p += kv_heads * pb;
      Pack(s.bits, codes.data(), c, p);
      p += CodeBytes(s.bits, c);
    }
    return;
  }
  for (int64_t t = first_token, end = first_token + count; t < end; t = GroupEnd(t, end)) {
    const int64_t n = GroupEnd(t, end) - t;
    const float* x = rows + (t - first_token) * c;
    codes.resize(static_cast<size_t>(n * c));
    for (int64_t ch = 0; ch < c; ++ch) {
      StoreParams(s, QuantizeGroup(s, x + ch, n, c, codes.data() + ch), p + ch * pb);
    }
    p += c * pb;
    Pack(s.bits, codes.data(), n * c, p);
    p += CodeBytes(s.bits, n * c);
  }
}

absl::Status Decode(WireForm form, bool values, std::string_view data, int64_t first_token,
                    int64_t count, int64_t kv_heads, int64_t head_dim, float* out,
                    DType plain_dtype) {
  const std::string what = Describe(form, values);
  if (form == WireForm::kTransform) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the transform form decodes with its transform (transform_codec.h)"));
  }
  if (count < 1 || first_token < 0 || kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", count, " rows from token ", first_token, " of ", kv_heads,
                     " heads of ", head_dim, " (rows, heads and dims must be >= 1)"));
  }
  if (form != WireForm::kPlain && first_token % kTokenGroup != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": first_token ", first_token,
                                                   " is not a multiple of the ", kTokenGroup,
                                                   "-token group"));
  }
  if (form == WireForm::kPlain && plain_dtype != DType::kF16 && plain_dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("plain rows in ", DTypeName(plain_dtype), " are not f16 or f32"));
  }
  const int64_t expected =
      EncodedBytes(form, values, first_token, count, kv_heads, head_dim, plain_dtype);
  if (static_cast<int64_t>(data.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", data.size(), " bytes for ", count,
                                                   " rows from token ", first_token, ", ", expected,
                                                   " expected"));
  }
  const int64_t c = kv_heads * head_dim;
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  if (form == WireForm::kPlain) {
    if (plain_dtype == DType::kF16) {
      F16ToF32Row(reinterpret_cast<const uint16_t*>(p), out, count * c);
    } else {
      std::memcpy(out, p, static_cast<size_t>(count * c * 4));
    }
    return absl::OkStatus();
  }
  if (const int64_t sink = SinkRows(first_token, count); sink > 0) {
    F16ToF32Row(reinterpret_cast<const uint16_t*>(p), out, sink * c);
    for (int64_t i = 0; i < sink * c; ++i) {
      if (!std::isfinite(out[i])) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": token ", first_token + i / c,
                                                       " channel ", i % c, " (sent in f16) is ",
                                                       out[i]));
      }
    }
    p += sink * c * 2;
    out += sink * c;
    first_token += sink;
    count -= sink;
  }
  const QuantScheme s = WireScheme(form, values);
  const int64_t pb = ParamBytes(s);
  auto bad_params = [&](GroupParams g, const std::string& where) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", where, " has scale ", g.scale,
                     s.with_min ? absl::StrCat(" and min ", g.min) : std::string(),
                     ", which cannot be decoded (a finite scale >= 0 whose values stay within ±",
                     InputLimit(s), " is)"));
  };
  std::vector<uint8_t> codes;
  if (values) {
    codes.resize(static_cast<size_t>(c));
    for (int64_t t = 0; t < count; ++t) {
      const uint8_t* params = p;
      p += kv_heads * pb;
      const int64_t token = first_token + t;
      if (!Unpack(s.bits, p, c, codes.data())) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": token ", token, " has non-zero padding"));
      }
      p += CodeBytes(s.bits, c);
      if (int64_t i = FirstBadCode(s, codes.data(), c); i >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": token ", token, " value ", i, " has code 0, never written"));
      }
      for (int64_t h = 0; h < kv_heads; ++h) {
        const GroupParams g = LoadParams(s, params + h * pb);
        if (!ParamsValid(s, g)) {
          return bad_params(g, absl::StrCat("token ", token, " head ", h));
        }
        DequantizeGroup(s, g, codes.data() + h * head_dim, head_dim, 1, out + t * c + h * head_dim);
      }
    }
    return absl::OkStatus();
  }
  for (int64_t t = first_token, end = first_token + count; t < end; t = GroupEnd(t, end)) {
    const int64_t n = GroupEnd(t, end) - t;
    const uint8_t* params = p;
    p += c * pb;
    codes.resize(static_cast<size_t>(n * c));
    if (!Unpack(s.bits, p, n * c, codes.data())) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the token group at ", t, " has non-zero padding"));
    }
    p += CodeBytes(s.bits, n * c);
    if (int64_t i = FirstBadCode(s, codes.data(), n * c); i >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": token ", t + i / c, " channel ",
                                                     i % c, " has code 0, never written"));
    }
    float* o = out + (t - first_token) * c;
    for (int64_t ch = 0; ch < c; ++ch) {
      const GroupParams g = LoadParams(s, params + ch * pb);
      if (!ParamsValid(s, g)) {
        return bad_params(g, absl::StrCat("channel ", ch, " of the token group at ", t));
      }
      DequantizeGroup(s, g, codes.data() + ch, n, c, o + ch);
    }
  }
  return absl::OkStatus();
}

absl::Status RoundTrip(WireForm form, bool values, float* rows, int64_t first_token, int64_t count,
                       int64_t kv_heads, int64_t head_dim, DType plain_dtype) {
  std::string bytes;
  Encode(form, values, rows, first_token, count, kv_heads, head_dim, &bytes, plain_dtype);
  return Decode(form, values, bytes, first_token, count, kv_heads, head_dim, rows, plain_dtype);
}

}  // namespace riskkv
