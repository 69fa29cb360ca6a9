// End-of-generation detection and token lookup for the spec readers.
#include "common/tokenizer/spec_util.h"

#include <algorithm>

#include "common/tokenizer/special_tokens.h"

namespace riskkv::tokenizer_internal {

int32_t FindToken(const TokenizerSpec& spec, std::string_view text) {
  auto it = std::find(spec.tokens.begin(), spec.tokens.end(), text);
  return it == spec.tokens.end() ? -1 : static_cast<int32_t>(it - spec.tokens.begin());
}

void AddEndOfGenerationId(TokenizerSpec* spec, int32_t id) {
  if (id < 0 || id == spec->eos_id) return;
  if (std::find(spec->eog_ids.begin(), spec->eog_ids.end(), id) != spec->eog_ids.end()) return;
  spec->eog_ids.push_back(id);
}

void AddWellKnownEndOfGenerationIds(TokenizerSpec* spec) {
  static constexpr std::string_view kEndOfTurn[] = {
      "<|im_end|>",    "<|endoftext|>",   "<|eot_id|>", "<|eom_id|>", "<|end|>",
      "<end_of_turn>", "<|end_of_text|>", "<EOT>",      "</s>",
  };
  for (size_t id = 0; id < spec->tokens.size() && id < spec->token_types.size(); ++id) {
    if (spec->token_types[id] != kTypeControl) continue;
    if (std::find(std::begin(kEndOfTurn), std::end(kEndOfTurn), spec->tokens[id]) !=
        std::end(kEndOfTurn)) {
      AddEndOfGenerationId(spec, static_cast<int32_t>(id));
    }
  }
}

}  // namespace riskkv::tokenizer_internal
