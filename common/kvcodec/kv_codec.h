// The retained KV of one layer on the migration wire: rows [first_token, first_token + count) of
// its keys or values, encoded in a wire form (wire_form.h). The functions here code the plain,
// int8 and int4 forms; the transform form needs its transform (transform_codec.h): for it
// EncodedBytes and LayerWireBytes are 0, Encode writes nothing and Decode refuses.
//
// - plain: the rows in plain_dtype (f32 or f16), little-endian, [count, kv_heads, head_dim].
// - int8 / int4: keys per channel over each token group [g * kTokenGroup, (g + 1) *
//   kTokenGroup) (KIVI's per-channel keys: a few channels carry most of the magnitude); values
//   per token and head (head_dim values). Groups are aligned to absolute token positions, so
//   what a row decodes to does not depend on how a layer's rows are cut into chunks, provided
//   first_token is a multiple of kTokenGroup (Decode refuses anything else).
//
//   The first kSinkTokens rows of the history (the attention sink every head attends to most)
//   cross in f16 ahead of the codes, [C f16] per row, and the groups start after them (the
//   first key group holds tokens [kSinkTokens, kTokenGroup)):
//   Keys, for each token group of n tokens:   [C params][n * C codes, token-major]
//   Values, for each token:                   [kv_heads params][C codes]
//   with C = kv_heads * head_dim, params as WireScheme() says (group_quant.h), 4-bit codes two
//   to a byte, the first in the low nibble, a group's or token's last odd nibble padded with 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/kvcodec/group_quant.h"
#include "common/kvcodec/wire_form.h"
#include "kernels/dtype.h"

namespace riskkv {

// Tokens per key group of the quantized forms; chunks of those forms start on a group.
inline constexpr int64_t kTokenGroup = 32;
// Rows at the start of a history that the quantized forms send in f16 (at most kTokenGroup).
inline constexpr int64_t kSinkTokens = 1;

// The quantization scheme of a quantized form's keys (values: false) or values; chosen by
// measurement on SmolLM2's KV (docs/services.md, "The wire forms").
QuantScheme WireScheme(WireForm form, bool values);

// Bytes Encode writes for these rows (0 when count is 0). plain_dtype matters for kPlain only.
int64_t EncodedBytes(WireForm form, bool values, int64_t first_token, int64_t count,
                     int64_t kv_heads, int64_t head_dim, DType plain_dtype);

// Keys and values of one layer's rows [0, history) in `form`: what a migration sends per layer,
// however it cuts the rows into chunks that start on a token group.
int64_t LayerWireBytes(WireForm form, int64_t history, int64_t kv_heads, int64_t head_dim,
                       DType plain_dtype);

// Encodes `rows` ([count, kv_heads * head_dim] f32) into *out, replacing its contents. For the
// quantized forms NaN encodes as 0 and magnitudes beyond the f16 range saturate; plain_dtype
// (kF32 or kF16) is the plain form's row type.
void Encode(WireForm form, bool values, const float* rows, int64_t first_token, int64_t count,
            int64_t kv_heads, int64_t head_dim, std::string* out, DType plain_dtype = DType::kF32);

// Decodes `data` into `out` ([count, kv_heads * head_dim] f32). InvalidArgument, with nothing
// promised about `out`, for: no rows, a negative first_token, shapes < 1, a quantized chunk whose
// first_token is not a multiple of kTokenGroup, a size other than EncodedBytes (both named), a
// sink row's value or a scale or min that is not finite, a negative scale, parameters whose decoded
// values would leave the f16 range (the group and channel, or the token and head, named), a code
// the encoder never writes, and non-zero padding.
absl::Status Decode(WireForm form, bool values, std::string_view data, int64_t first_token,
                    int64_t count, int64_t kv_heads, int64_t head_dim, float* out,
                    DType plain_dtype = DType::kF32);

// rows := Decode(Encode(rows)): exactly what a target decodes from these rows sent in `form` (in
// chunks of any size that start on a token group), for measuring a form's damage without a
// network. Decode's errors for inputs it refuses (a misaligned first_token, no rows).
absl::Status RoundTrip(WireForm form, bool values, float* rows, int64_t first_token, int64_t count,
                       int64_t kv_heads, int64_t head_dim, DType plain_dtype = DType::kF32);

}  // namespace riskkv
