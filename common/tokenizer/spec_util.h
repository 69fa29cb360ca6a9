// Helpers shared by the readers that turn model files into a TokenizerSpec.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/tokenizer/tokenizer.h"

namespace riskkv::tokenizer_internal {

// Id of the first token whose text is `text`, or -1.
int32_t FindToken(const TokenizerSpec& spec, std::string_view text);

// Adds to spec->eog_ids the control tokens that end a turn in the common chat formats
// (<|im_end|>, <|endoftext|>, <|eot_id|>, ...), the way llama.cpp recognises them; skips eos_id
// and ids already listed.
void AddWellKnownEndOfGenerationIds(TokenizerSpec* spec);

// Adds `id` to spec->eog_ids unless it is -1, eos_id or already there.
void AddEndOfGenerationId(TokenizerSpec* spec, int32_t id);

}  // namespace riskkv::tokenizer_internal
