#include "common/tokenizer/chat_format.h"

#include <initializer_list>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/spec_util.h"
#include "common/tokenizer/special_tokens.h"

namespace riskkv {
namespace {

bool HasControlTokens(const Tokenizer& tokenizer, std::initializer_list<std::string_view> names) {
  const TokenizerSpec& spec = tokenizer.spec();
  for (std::string_view name : names) {
    const int32_t id = tokenizer_internal::FindToken(spec, name);
    if (id < 0) return false;
    if (!spec.token_types.empty() && spec.token_types[id] != tokenizer_internal::kTypeControl) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<ChatFormat> DetectChatFormat(const Tokenizer& tokenizer) {
  if (HasControlTokens(tokenizer, {"<|im_start|>", "<|im_end|>"})) return ChatFormat::kChatMl;
  if (HasControlTokens(tokenizer, {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})) {
    return ChatFormat::kLlama3;
  }
  return absl::FailedPreconditionError(
      "the tokenizer has neither ChatML's <|im_start|>/<|im_end|> nor Llama 3's "
      "<|start_header_id|>/<|end_header_id|>/<|eot_id|> as control tokens; give the prompt "
      "in the model's own chat format instead");
}

std::string ChatPrompt(ChatFormat format, std::string_view user) {
  switch (format) {
    case ChatFormat::kChatMl:
      return absl::StrCat("<|im_start|>user\n", absl::string_view(user.data(), user.size()),
                          "<|im_end|>\n<|im_start|>assistant\n");
    case ChatFormat::kLlama3:
      return absl::StrCat("<|start_header_id|>user<|end_header_id|>\n\n",
                          absl::string_view(user.data(), user.size()),
                          "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  }
  return std::string(user);
}

}  // namespace riskkv
