// Files replaced in one step: written under a temporary name next to the target, then renamed
// over it, so a reader (or a crash) sees the old content or the new, never a part.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace riskkv {

// A temporary name next to `path`, unique to this process and call.
std::string TemporaryPathFor(const std::string& path);

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace riskkv
