// Chat formats chosen from a tokenizer's control tokens, and rendered so that Encode with
// parse_special turns every marker into its control id.
#include "common/tokenizer/chat_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "common/tokenizer/text_util.h"

namespace riskkv {
namespace {

using ::testing::HasSubstr;

// Control tokens `specials`, then the 256 byte characters.
std::unique_ptr<Tokenizer> WithControlTokens(const std::vector<std::string>& specials,
                                             int32_t control_type = 3) {
  TokenizerSpec spec;
  spec.kind = TokenizerSpec::Kind::kByteLevelBpe;
  spec.tokens = specials;
  spec.token_types.assign(specials.size(), control_type);
  for (const std::string& ch : tokenizer_internal::ByteToUnicode()) {
    spec.tokens.push_back(ch);
    spec.token_types.push_back(1);
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

int Count(const std::vector<int32_t>& ids, int32_t id) {
  return static_cast<int>(std::count(ids.begin(), ids.end(), id));
}

TEST(ChatFormatTest, ChatMlWhereItsMarkersAreControlTokens) {
  auto t = WithControlTokens({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  ASSERT_NE(t, nullptr);
  absl::StatusOr<ChatFormat> f = DetectChatFormat(*t);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, ChatFormat::kChatMl);
  const std::string prompt = ChatPrompt(*f, "hi");
  EXPECT_EQ(prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  auto ids = t->Encode(prompt, false, /*parse_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(Count(*ids, 1), 2);
  EXPECT_EQ(Count(*ids, 2), 1);
}

TEST(ChatFormatTest, Llama3WhereItsHeadersAreControlTokens) {
  auto t = WithControlTokens(
      {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"});
  ASSERT_NE(t, nullptr);
  absl::StatusOr<ChatFormat> f = DetectChatFormat(*t);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(*f, ChatFormat::kLlama3);
  const std::string prompt = ChatPrompt(*f, "hi");
  EXPECT_EQ(prompt,
            "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  auto ids = t->Encode(prompt, false, /*parse_special=*/true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(Count(*ids, 1), 2);
  EXPECT_EQ(Count(*ids, 2), 2);
  EXPECT_EQ(Count(*ids, 3), 1);
}

TEST(ChatFormatTest, NoFormatWithoutControlMarkers) {
  // The markers as plain (user-defined) tokens do not count, nor do half a format's markers.
  for (const auto& [tokens, type] : std::vector<std::pair<std::vector<std::string>, int32_t>>{
           {{"<|im_start|>", "<|im_end|>"}, 4},
           {{"<|im_start|>"}, 3},
           {{"<|start_header_id|>", "<|end_header_id|>"}, 3},
           {{"<s>", "</s>"}, 3}}) {
    auto t = WithControlTokens(tokens, type);
    ASSERT_NE(t, nullptr);
    absl::StatusOr<ChatFormat> f = DetectChatFormat(*t);
    ASSERT_FALSE(f.ok()) << tokens.front();
    EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(f.status().message(), HasSubstr("<|start_header_id|>"));
  }
}

}  // namespace
}  // namespace riskkv
