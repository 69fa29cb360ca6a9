// UTF-8 checks and GPT-2's byte <-> printable-character mapping, shared by the tokenizers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/base/strings.h"

namespace riskkv::tokenizer_internal {

// OK when `text` is well-formed UTF-8 (no overlong forms, surrogates, or code points past
// U+10FFFF); otherwise InvalidArgument naming the first bad byte offset.
absl::Status ValidateUtf8(std::string_view text);

// Length of the UTF-8 sequence that starts with `lead` (1 for bytes that cannot start one, so a
// walk over unchecked text still advances).
int Utf8SequenceLength(unsigned char lead);

// Decodes the code point at text[*pos] of valid UTF-8 and advances *pos past it.
uint32_t NextCodePoint(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `cp` (a valid scalar value).
void AppendUtf8(uint32_t cp, std::string* out);

// GPT-2's byte-to-unicode table: byte b is written as this (printable) character in byte-level
// vocabularies, so token texts never hold raw control bytes or spaces.
const std::array<std::string, 256>& ByteToUnicode();

// The byte a byte-level character stands for, or -1 if `cp` is not one of the 256.
int UnicodeToByte(uint32_t cp);

}  // namespace riskkv::tokenizer_internal
