// Unicode normalization of text before pre-tokenization (Hugging Face tokenizer.json
// "normalizer": NFC in Qwen2 and Qwen2.5), through utf8proc.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace riskkv {

enum class Normalization { kNone, kNfc, kNfd, kNfkc, kNfkd };

// "NFC", "NFD", "NFKC", "NFKD" (tokenizer.json's type names) or "none"; nullopt for any other.
std::optional<Normalization> NormalizationFromName(std::string_view name);
const char* NormalizationName(Normalization form);

// `text` (valid UTF-8) in the normal form; kNone returns it unchanged. Unicode 15 data (Debian
// 12's utf8proc 2.8; Hugging Face tokenizers uses the unicode-normalization crate's tables).
absl::StatusOr<std::string> Normalize(Normalization form, std::string_view text);

}  // namespace riskkv
