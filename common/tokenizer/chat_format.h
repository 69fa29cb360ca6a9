// The chat turn format a tokenizer's control tokens call for: ChatML (<|im_start|> ...
// <|im_end|>, SmolLM2 and Qwen2.5) or Llama 3's headers (<|start_header_id|> ...
// <|eot_id|>). Encode the result with parse_special so the markers become their ids.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

namespace riskkv {

enum class ChatFormat { kChatMl, kLlama3 };

// The format whose markers are all control tokens of `tokenizer`; FailedPrecondition naming the
// markers looked for when neither's are.
absl::StatusOr<ChatFormat> DetectChatFormat(const Tokenizer& tokenizer);

// One user turn followed by the opening of the assistant's, as the models' own templates render
// it (no system turn; BOS comes from Encode's add_special).
std::string ChatPrompt(ChatFormat format, std::string_view user);

}  // namespace riskkv
