#include "common/tokenizer/normalizer.h"

#include <cstdlib>
#include <memory>

#include "absl/status/status.h"
#include "utf8proc.h"

namespace riskkv {

std::optional<Normalization> NormalizationFromName(std::string_view name) {
  if (name == "none") return Normalization::kNone;
  if (name == "NFC") return Normalization::kNfc;
  if (name == "NFD") return Normalization::kNfd;
  if (name == "NFKC") return Normalization::kNfkc;
  if (name == "NFKD") return Normalization::kNfkd;
  return std::nullopt;
}

const char* NormalizationName(Normalization form) {
  switch (form) {
    case Normalization::kNone:
      return "none";
    case Normalization::kNfc:
      return "NFC";
    case Normalization::kNfd:
      return "NFD";
    case Normalization::kNfkc:
      return "NFKC";
    case Normalization::kNfkd:
      return "NFKD";
  }
  return "unknown";
}

absl::StatusOr<std::string> Normalize(Normalization form, std::string_view text) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Normalization::kNone:
      return std::string(text);
    case Normalization::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case Normalization::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case Normalization::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case Normalization::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  if (text.empty()) return std::string();
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  if (n < 0) {
    std::string message(NormalizationName(form));
    message += " normalization failed: ";
    message += utf8proc_errmsg(n);
    return absl::InvalidArgumentError(message);
  }
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace riskkv
