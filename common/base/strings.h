// String helpers shared by every layer: views across Abseil's string_view and views of raw bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/strings/string_view.h"

namespace riskkv {

// The Abseil this builds against (Debian's) has its own string_view type rather than
// std::string_view, and StrCat, StrJoin and heterogeneous hash lookups do not take a std one.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

// `size` bytes at `data` (a mapped file, a digest) seen as characters, to compare, copy or
// write them as a string.
inline std::string_view AsChars(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace riskkv
