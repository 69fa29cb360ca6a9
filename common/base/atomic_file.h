// Files replaced in one step: written under a temporary name next to the target, then renamed
// over it, so a reader (or a crash) sees the old content or the new, never a part.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace riskkv {

// A temporary name next to `path`, unique to this process and call (NAME.tmp.PID.N).
std::string TemporaryPathFor(const std::string& path);

// Removes the temporaries in `dir` that no running writer can finish: those of processes that no
// longer run, and this process's own. Call it at start, before this process writes there: in a
// container a restarted server has the same PID (often 1) as the one whose crash left them.
void RemoveAbandonedTemporaries(const std::string& dir);

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

}  // namespace riskkv
