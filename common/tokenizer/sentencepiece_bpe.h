// SentencePiece-style BPE (the GGUF "llama" tokenizer of TinyLlama / Llama 2): spaces become
// U+2581, adjacent pieces merge by highest vocabulary score, and characters without a piece fall
// back to <0xXX> byte tokens.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace riskkv::tokenizer_internal {

// Checks the SentencePiece parts of the spec (one score per token) and builds the tokenizer.
// The spec's common fields are already validated by Tokenizer::Create.
absl::StatusOr<std::unique_ptr<Tokenizer>> CreateSentencePiece(TokenizerSpec spec);

}  // namespace riskkv::tokenizer_internal
