// Byte-level BPE (GPT-2 style, as in SmolLM2, Qwen2 and Llama 3): text bytes are written as
// GPT-2's printable characters, split by a regex pre-tokenizer and merged by merge rank.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace riskkv::tokenizer_internal {

// Checks the byte-level parts of the spec (merges, pre-tokenizer) and builds the tokenizer.
// The spec's common fields (ids, sizes) are already validated by Tokenizer::Create.
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateByteLevelBpe(TokenizerSpec spec);

}  // namespace riskkv::tokenizer_internal
