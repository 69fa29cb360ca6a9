// The forms a migration can put the retained KV in on the wire: plain rows in the session's KV
// dtype, or int8 / 4-bit codes with per-group scales (kv_codec.h), and their names ("plain",
// "int8", "int4") as flags, policies and logs spell them.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace riskkv {

enum class WireForm : uint8_t { kPlain, kInt8, kInt4 };

std::string_view WireFormName(WireForm form);
// "plain", "int8" or "int4"; InvalidArgument naming anything else.
absl::StatusOr<WireForm> ParseWireForm(std::string_view name);

}  // namespace riskkv
