// Leftmost-longest literal matching of special tokens.
#include "common/tokenizer/special_tokens.h"

#include <algorithm>

#include "common/tokenizer/text_util.h"

namespace riskkv::tokenizer_internal {

SpecialTokenMatcher::SpecialTokenMatcher(const TokenizerSpec& spec) {
  for (size_t i = 0; i < spec.token_types.size() && i < spec.tokens.size(); ++i) {
    const int32_t type = spec.token_types[i];
    if (type != kTypeControl && type != kTypeUnknown && type != kTypeUserDefined) continue;
    const std::string& text = spec.tokens[i];
    // A token that is not valid UTF-8 can never occur in (validated) input text.
    if (text.empty() || !ValidateUtf8(text).ok()) continue;
    by_first_byte_[static_cast<unsigned char>(text[0])].push_back(
        {text, static_cast<int32_t>(i), type != kTypeUserDefined});
    any_ = true;
  }
  for (auto& entries : by_first_byte_) {
    std::stable_sort(entries.begin(), entries.end(),
                     [](const Entry& a, const Entry& b) { return a.text.size() > b.text.size(); });
  }
}

std::vector<TextFragment> SpecialTokenMatcher::Split(std::string_view text,
                                                     bool parse_special) const {
  std::vector<TextFragment> out;
  if (!any_) {
    if (!text.empty()) out.push_back({text, -1});
    return out;
  }
  size_t run_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const Entry* hit = nullptr;
    for (const Entry& e : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      if (e.needs_parse_special && !parse_special) continue;
      if (text.substr(i).starts_with(e.text)) {
        hit = &e;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    if (i > run_start) out.push_back({text.substr(run_start, i - run_start), -1});
    out.push_back({text.substr(i, hit->text.size()), hit->id});
    i += hit->text.size();
    run_start = i;
  }
  if (run_start < text.size()) out.push_back({text.substr(run_start), -1});
  return out;
}

}  // namespace riskkv::tokenizer_internal
