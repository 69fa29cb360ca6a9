// UTF-8 validation and the GPT-2 byte-to-unicode mapping.
#include "common/tokenizer/text_util.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/tokenizer.h"

namespace riskkv::tokenizer_internal {
namespace {

// GPT-2 keeps printable Latin-1 bytes as themselves and moves the other 68 (controls, space,
// DEL, NBSP, soft hyphen, ...) to U+0100 upwards, in byte order.
bool IsPrintableLatin1(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 256> shifted_to_byte;  // index cp - 0x100 -> byte, for the moved bytes
  ByteTables() {
    shifted_to_byte.fill(-1);
    int next_shifted = 0;
    for (int b = 0; b < 256; ++b) {
      uint32_t cp = static_cast<uint32_t>(b);
      if (!IsPrintableLatin1(b)) {
        shifted_to_byte[next_shifted] = b;
        cp = 0x100 + static_cast<uint32_t>(next_shifted++);
      }
      AppendUtf8(cp, &to_unicode[b]);
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables* tables = new ByteTables();
  return *tables;
}

}  // namespace

absl::Status ValidateUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    uint32_t min_cp = 0;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("invalid UTF-8: byte 0x",
                                                     absl::Hex(c, absl::kZeroPad2), " at offset ",
                                                     i, " cannot start a character"));
    }
    if (i + len > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid UTF-8: truncated character at offset ", i));
    }
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid UTF-8: missing continuation byte at offset ", i + k));
      }
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid UTF-8: overlong form, surrogate or out-of-range code point at offset ", i));
    }
    i += len;
  }
  return absl::OkStatus();
}

int Utf8SequenceLength(unsigned char lead) {
  if (lead >= 0xF0 && lead <= 0xF7) return 4;
  if (lead >= 0xE0) return lead <= 0xEF ? 3 : 1;
  if (lead >= 0xC0) return 2;
  return 1;
}

uint32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const unsigned char c = s[*pos];
  int len = Utf8SequenceLength(c);
  if (*pos + len > text.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (s[*pos + k] & 0x3F);
  *pos += len;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const std::array<std::string, 256>& ByteToUnicode() { return Tables().to_unicode; }

int UnicodeToByte(uint32_t cp) {
  if (cp < 0x100) return IsPrintableLatin1(static_cast<int>(cp)) ? static_cast<int>(cp) : -1;
  if (cp < 0x100 + 256) return Tables().shifted_to_byte[cp - 0x100];
  return -1;
}

}  // namespace riskkv::tokenizer_internal

namespace riskkv {

absl::Status ValidateUtf8(std::string_view text) { return tokenizer_internal::ValidateUtf8(text); }

}  // namespace riskkv
