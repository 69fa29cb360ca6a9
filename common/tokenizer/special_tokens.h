// Literal matching of special (control, unknown) and user-defined tokens in text, before the
// rest of the text goes through the pre-tokenizer or SentencePiece merging.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/tokenizer.h"

namespace riskkv::tokenizer_internal {

// GGUF token types (llama.cpp's llama_token_type).
enum TokenType : int32_t {
  kTypeUndefined = 0,
  kTypeNormal = 1,
  kTypeUnknown = 2,
  kTypeControl = 3,
  kTypeUserDefined = 4,
  kTypeUnused = 5,
  kTypeByte = 6,
};

// Type of token `id` of a validated spec (normal when the spec has no types).
inline int32_t TokenTypeOf(const TokenizerSpec& spec, int32_t id) {
  return spec.token_types.empty() ? kTypeNormal : spec.token_types[id];
}

// A run of text, or one special token (id >= 0) found in it.
struct TextFragment {
  std::string_view text;
  int32_t id = -1;
};

class SpecialTokenMatcher {
 public:
  explicit SpecialTokenMatcher(const TokenizerSpec& spec);

  // Splits `text` at literal occurrences of the tokens: control and unknown ones only when
  // `parse_special`, user-defined ones always (as HF and llama.cpp do). At each position the
  // longest token wins, scanning left to right (HF's leftmost-longest rule). Empty text runs
  // are left out.
  std::vector<TextFragment> Split(std::string_view text, bool parse_special) const;

 private:
  struct Entry {
    std::string text;
    int32_t id;
    bool needs_parse_special;
  };
  // Candidates by first byte, longest first.
  std::array<std::vector<Entry>, 256> by_first_byte_;
  bool any_ = false;
};

}  // namespace riskkv::tokenizer_internal
