// The forms a migration can put the retained KV in on the wire: plain rows in the session's KV
// dtype, int8 / 4-bit codes with per-group scales (kv_codec.h), or transform-coded rows
// (transform_codec.h: each layer's fitted transform, held in the predictor bank, and a step that
// the retention policy names), and their names ("plain", "int8", "int4", "transform") as flags,
// policies and logs spell them. kv_codec.h codes the first three; the transform form codes with
// its transform.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace riskkv {

enum class WireForm : uint8_t { kPlain, kInt8, kInt4, kTransform };

inline constexpr int kWireFormCount = 4;

std::string_view WireFormName(WireForm form);
// "plain", "int8", "int4" or "transform"; InvalidArgument naming anything else.
absl::StatusOr<WireForm> ParseWireForm(std::string_view name);

}  // namespace riskkv
