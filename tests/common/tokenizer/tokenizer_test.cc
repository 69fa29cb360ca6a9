// Tokenizer behaviour on small hand-made vocabularies: merge order, special tokens, byte
// fallback, decoding, and the errors for bad input and bad specs.
#include "common/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/tokenizer/text_util.h"

namespace riskkv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Byte-level vocabulary: 3 control tokens, the 256 byte characters, then one token per merge.
TokenizerSpec ByteLevelSpec(const std::vector<std::string>& merges, std::string pre = "gpt2") {
  TokenizerSpec spec;
  spec.kind = TokenizerSpec::Kind::kByteLevelBpe;
  spec.pre = std::move(pre);
  spec.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  spec.token_types = {3, 3, 3};
  for (const std::string& ch : tokenizer_internal::ByteToUnicode()) {
    spec.tokens.push_back(ch);
    spec.token_types.push_back(1);
  }
  for (const std::string& merge : merges) {
    const size_t space = merge.find(' ');
    spec.tokens.push_back(merge.substr(0, space) + merge.substr(space + 1));
    spec.token_types.push_back(1);
  }
  spec.merges = merges;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.unk_id = 0;
  spec.eog_ids = {0};
  return spec;
}

int32_t Id(const Tokenizer& t, const std::string& token) {
  const auto& tokens = t.spec().tokens;
  auto it = std::find(tokens.begin(), tokens.end(), token);
  return it == tokens.end() ? -1 : static_cast<int32_t>(it - tokens.begin());
}

std::unique_ptr<Tokenizer> MustCreate(TokenizerSpec spec) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

std::vector<int32_t> MustEncode(const Tokenizer& t, std::string_view text, bool add_special = false,
                                bool parse_special = true) {
  absl::StatusOr<std::vector<int32_t>> ids = t.Encode(text, add_special, parse_special);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(ByteLevelBpeTest, MergesFollowRankNotPosition) {
  auto first_bc = MustCreate(ByteLevelSpec({"b c", "a b"}));
  EXPECT_THAT(MustEncode(*first_bc, "abc"), ElementsAre(Id(*first_bc, "a"), Id(*first_bc, "bc")));
  auto first_ab = MustCreate(ByteLevelSpec({"a b", "b c"}));
  EXPECT_THAT(MustEncode(*first_ab, "abc"), ElementsAre(Id(*first_ab, "ab"), Id(*first_ab, "c")));
}

TEST(ByteLevelBpeTest, EqualRanksMergeLeftmostFirst) {
  auto t = MustCreate(ByteLevelSpec({"a a"}));
  EXPECT_THAT(MustEncode(*t, "aaa"), ElementsAre(Id(*t, "aa"), Id(*t, "a")));
  EXPECT_THAT(MustEncode(*t, "aaaa"), ElementsAre(Id(*t, "aa"), Id(*t, "aa")));
}

TEST(ByteLevelBpeTest, MergesBuildOnEarlierMerges) {
  auto t = MustCreate(ByteLevelSpec({"h e", "l l", "he ll", "hell o", "Ġ w", "o r"}));
  EXPECT_THAT(MustEncode(*t, "hello world"),
              ElementsAre(Id(*t, "hello"), Id(*t, "Ġw"), Id(*t, "or"), Id(*t, "l"), Id(*t, "d")));
}

TEST(ByteLevelBpeTest, PreTokensAreNeverMergedAcross) {
  // "a" and "!" sit in different GPT-2 pre-tokens, so the merge "a !" must not apply.
  auto t = MustCreate(ByteLevelSpec({"a !"}));
  EXPECT_THAT(MustEncode(*t, "a!"), ElementsAre(Id(*t, "a"), Id(*t, "!")));
}

TEST(ByteLevelBpeTest, SmollmSplitsDigitsOneByOne) {
  auto gpt2 = MustCreate(ByteLevelSpec({"Ġ 1", "1 2"}, "gpt2"));
  EXPECT_THAT(MustEncode(*gpt2, " 12"), ElementsAre(Id(*gpt2, "Ġ1"), Id(*gpt2, "2")));
  auto smollm = MustCreate(ByteLevelSpec({"Ġ 1", "1 2"}, "smollm"));
  EXPECT_THAT(MustEncode(*smollm, " 12"),
              ElementsAre(Id(*smollm, "Ġ"), Id(*smollm, "1"), Id(*smollm, "2")));
}

TEST(ByteLevelBpeTest, MultiByteCharactersUseByteTokens) {
  auto t = MustCreate(ByteLevelSpec({}));
  const auto& bytes = tokenizer_internal::ByteToUnicode();
  // "é" is C3 A9.
  EXPECT_THAT(MustEncode(*t, "\xC3\xA9"), ElementsAre(Id(*t, bytes[0xC3]), Id(*t, bytes[0xA9])));
  EXPECT_EQ(t->TokenBytes(Id(*t, bytes[0xC3])), "\xC3");
}

TEST(ByteLevelBpeTest, IgnoreMergesEmitsWholeVocabularyWords) {
  // "abc" is in the vocabulary but no merge sequence reaches it.
  TokenizerSpec spec = ByteLevelSpec({"a b"}, "llama3");
  spec.tokens.push_back("abc");
  spec.token_types.push_back(1);
  auto merging = MustCreate(spec);
  EXPECT_THAT(MustEncode(*merging, "abc"), ElementsAre(Id(*merging, "ab"), Id(*merging, "c")));
  spec.ignore_merges = true;
  auto whole = MustCreate(spec);
  EXPECT_THAT(MustEncode(*whole, "abc"), ElementsAre(Id(*whole, "abc")));
}

TEST(TokenizerTest, SpecialTokensOnlyWhenParsingThem) {
  auto t = MustCreate(ByteLevelSpec({}));
  const std::vector<int32_t> parsed = MustEncode(*t, "<|im_start|>hi<|im_end|>", false, true);
  EXPECT_THAT(parsed, ElementsAre(1, Id(*t, "h"), Id(*t, "i"), 2));
  const std::vector<int32_t> literal = MustEncode(*t, "<|im_start|>hi<|im_end|>", false, false);
  EXPECT_EQ(literal.size(), 24u);  // every character a byte token: no merges in this vocabulary
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 1), 0);
  // Rendering control tokens is opt-in.
  EXPECT_EQ(*t->Decode(parsed), "hi");
  EXPECT_EQ(*t->Decode(parsed, /*render_special=*/true), "<|im_start|>hi<|im_end|>");
  EXPECT_EQ(*t->Decode(literal), "<|im_start|>hi<|im_end|>");
}

TEST(TokenizerTest, LongestSpecialTokenWinsAtAPosition) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.tokens.push_back("<|im_start|>user");
  spec.token_types.push_back(3);
  auto t = MustCreate(spec);
  const int32_t user = static_cast<int32_t>(spec.tokens.size()) - 1;
  EXPECT_THAT(MustEncode(*t, "<|im_start|>user<|im_start|>"), ElementsAre(user, 1));
}

TEST(TokenizerTest, UserDefinedTokensAreAlwaysMatched) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.tokens.push_back("hello world");
  spec.token_types.push_back(4);
  auto t = MustCreate(spec);
  const int32_t added = static_cast<int32_t>(spec.tokens.size()) - 1;
  EXPECT_THAT(MustEncode(*t, "hello world", false, false), ElementsAre(added));
  EXPECT_EQ(*t->Decode(std::vector<int32_t>{added}), "hello world");
}

TEST(TokenizerTest, AddSpecialPrependsBos) {
  TokenizerSpec spec = ByteLevelSpec({});
  spec.add_bos = true;
  auto t = MustCreate(spec);
  EXPECT_THAT(MustEncode(*t, "", true), ElementsAre(1));
  EXPECT_THAT(MustEncode(*t, "", false), ElementsAre());
  EXPECT_THAT(MustEncode(*t, "a", true), ElementsAre(1, Id(*t, "a")));
}

TEST(TokenizerTest, EndOfGeneration) {
  auto t = MustCreate(ByteLevelSpec({}));
  EXPECT_TRUE(t->IsEndOfGeneration(2));  // eos
  EXPECT_TRUE(t->IsEndOfGeneration(0));  // listed in eog_ids
  EXPECT_FALSE(t->IsEndOfGeneration(1));
  EXPECT_FALSE(t->IsEndOfGeneration(-1));
}

TEST(TokenizerTest, InvalidUtf8IsAnError) {
  auto t = MustCreate(ByteLevelSpec({}));
  for (const std::string bad : {"\xFF", "ab\xC3", "\xC3(", "\xE0\x80\x80", "\xED\xA0\x80",
                                "\xF4\x90\x80\x80", "\xC0\xAF", "ok\x80"}) {
    absl::StatusOr<std::vector<int32_t>> ids = t->Encode(bad, false, true);
    ASSERT_FALSE(ids.ok()) << "accepted " << ::testing::PrintToString(bad);
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ids.status().message(), HasSubstr("UTF-8"));
  }
  // Embedded NUL and 4-byte characters are fine.
  EXPECT_TRUE(t->Encode(std::string("a\0b", 3), false, true).ok());
  EXPECT_TRUE(t->Encode("\xF0\x9F\x98\x80", false, true).ok());
}

TEST(TokenizerTest, DecodeRejectsOutOfRangeIds) {
  auto t = MustCreate(ByteLevelSpec({}));
  for (int32_t bad : {-1, t->vocab_size(), 1 << 30}) {
    absl::StatusOr<std::string> text = t->Decode(std::vector<int32_t>{3, bad});
    ASSERT_FALSE(text.ok()) << bad;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(text.status().message(), HasSubstr("out of range"));
  }
  EXPECT_EQ(t->TokenBytes(-5), "");
  EXPECT_EQ(t->TokenBytes(t->vocab_size()), "");
}

// SentencePiece vocabulary: <unk> <s> </s>, optionally the 256 byte tokens, then pieces whose
// scores (higher merges first) are given.
TokenizerSpec SentencePieceSpec(const std::vector<std::pair<std::string, float>>& pieces,
                                bool byte_tokens = true) {
  TokenizerSpec spec;
  spec.kind = TokenizerSpec::Kind::kSentencePiece;
  spec.tokens = {"<unk>", "<s>", "</s>"};
  spec.token_types = {2, 3, 3};
  spec.scores = {0, 0, 0};
  for (int b = 0; byte_tokens && b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    spec.tokens.push_back(name);
    spec.token_types.push_back(6);
    spec.scores.push_back(0);
  }
  for (const auto& [piece, score] : pieces) {
    spec.tokens.push_back(piece);
    spec.token_types.push_back(1);
    spec.scores.push_back(score);
  }
  spec.unk_id = 0;
  spec.bos_id = 1;
  spec.eos_id = 2;
  spec.add_bos = true;
  spec.add_space_prefix = true;
  return spec;
}

const std::vector<std::pair<std::string, float>> kPieces = {
    {"\xE2\x96\x81", -1},
    {"h", -2},
    {"e", -3},
    {"l", -4},
    {"o", -5},
    {"w", -6},
    {"r", -7},
    {"d", -8},
    {"\xE2\x96\x81h", -9},
    {"ll", -10},
    {"\xE2\x96\x81he", -11},
    {"lo", -12},
    {"\xE2\x96\x81hell", -13},
    {"\xE2\x96\x81hello", -14},
};

TEST(SentencePieceTest, MergesByScoreWithPrefixSpace) {
  auto t = MustCreate(SentencePieceSpec(kPieces));
  // ▁ h e l l o -> (▁h) e l l o -> (▁h) e (ll) o -> (▁he)(ll) o -> (▁hell) o -> (▁hello)
  EXPECT_THAT(MustEncode(*t, "hello", true), ElementsAre(1, Id(*t, "\xE2\x96\x81hello")));
  EXPECT_EQ(*t->Decode(MustEncode(*t, "hello", true)), "hello");
  // A leading space is kept: two ▁ then the word.
  EXPECT_THAT(MustEncode(*t, " hello"),
              ElementsAre(Id(*t, "\xE2\x96\x81"), Id(*t, "\xE2\x96\x81hello")));
  EXPECT_EQ(*t->Decode(MustEncode(*t, " hello")), " hello");
}

TEST(SentencePieceTest, HigherScoreWinsOverPosition) {
  // "lo" (-12) would merge before nothing else; "ll" (-10) outranks it in "llo".
  auto t = MustCreate(SentencePieceSpec(kPieces));
  EXPECT_THAT(MustEncode(*t, "llo"),
              ElementsAre(Id(*t, "\xE2\x96\x81"), Id(*t, "ll"), Id(*t, "o")));
}

TEST(SentencePieceTest, ByteFallbackAndUnknown) {
  auto bytes = MustCreate(SentencePieceSpec(kPieces));
  // "é" has no piece: its UTF-8 bytes C3 A9 as byte tokens, decoded back to the character.
  const std::vector<int32_t> ids = MustEncode(*bytes, "\xC3\xA9");
  EXPECT_THAT(ids,
              ElementsAre(Id(*bytes, "\xE2\x96\x81"), Id(*bytes, "<0xC3>"), Id(*bytes, "<0xA9>")));
  EXPECT_EQ(*bytes->Decode(ids), "\xC3\xA9");
  EXPECT_EQ(bytes->TokenBytes(Id(*bytes, "<0xC3>")), "\xC3");
  // Without byte tokens the character becomes one <unk>, which decodes to nothing.
  auto no_bytes = MustCreate(SentencePieceSpec(kPieces, /*byte_tokens=*/false));
  EXPECT_THAT(MustEncode(*no_bytes, "h\xC3\xA9"), ElementsAre(Id(*no_bytes, "\xE2\x96\x81h"), 0));
}

TEST(SentencePieceTest, EachRunAfterASpecialTokenGetsThePrefixSpace) {
  auto t = MustCreate(SentencePieceSpec(kPieces));
  EXPECT_THAT(MustEncode(*t, "hello</s>hello"),
              ElementsAre(Id(*t, "\xE2\x96\x81hello"), 2, Id(*t, "\xE2\x96\x81hello")));
  EXPECT_EQ(*t->Decode(MustEncode(*t, "hello</s>hello")), "hello hello");
}

TEST(SentencePieceTest, NoPrefixSpaceWhenSpecSaysSo) {
  TokenizerSpec spec = SentencePieceSpec(kPieces);
  spec.add_space_prefix = false;
  auto t = MustCreate(spec);
  EXPECT_THAT(MustEncode(*t, "he"), ElementsAre(Id(*t, "h"), Id(*t, "e")));
  EXPECT_EQ(*t->Decode(MustEncode(*t, " he")), " he");
}

TEST(SentencePieceTest, InvalidInputIsAnError) {
  auto t = MustCreate(SentencePieceSpec(kPieces));
  EXPECT_EQ(t->Encode("\xC3", false, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(t->Decode(std::vector<int32_t>{t->vocab_size()}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenizerTest, LongRunsOfOneCharacterClass) {
  // Long whitespace, letter, digit and punctuation runs stress the regex engine's backtracking
  // and the merge queue; each must encode and round-trip.
  auto bpe = MustCreate(ByteLevelSpec({"a a", "aa aa", "Ġ Ġ", "ĠĠ ĠĠ"}, "smollm"));
  auto spm = MustCreate(SentencePieceSpec(kPieces));
  const size_t n = 200000;
  for (const std::string& text :
       {std::string(n, ' ') + "a", std::string(n, 'a'), std::string(n, '7'), std::string(n, '!'),
        std::string(n, '\n') + " x", std::string(n, ' ') + "\n"}) {
    for (const Tokenizer* t : {bpe.get(), spm.get()}) {
      absl::StatusOr<std::vector<int32_t>> ids = t->Encode(text, false, true);
      ASSERT_TRUE(ids.ok()) << ids.status();
      EXPECT_EQ(*t->Decode(*ids), text);
    }
  }
}

// Create() must name what is wrong with a spec.
void ExpectCreateError(TokenizerSpec spec, const std::string& fragment) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(std::move(spec));
  ASSERT_FALSE(t.ok()) << "accepted a spec that should fail with '" << fragment << "'";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr(fragment));
}

TEST(TokenizerSpecTest, MalformedSpecsAreRejected) {
  {
    TokenizerSpec spec = ByteLevelSpec({"a b"});
    spec.merges.push_back("a zz");
    ExpectCreateError(spec, "'zz' is not in the vocabulary");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.merges.push_back("ab");
    ExpectCreateError(spec, "not of the form 'left right'");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.merges.push_back("a b");  // "ab" itself is not a token
    ExpectCreateError(spec, "'ab' is not in the vocabulary");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.bos_id = spec.tokens.size();
    ExpectCreateError(spec, "bos_id 259 out of range");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.eos_id = -7;
    ExpectCreateError(spec, "eos_id -7 out of range");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.eog_ids.push_back(100000);
    ExpectCreateError(spec, "end-of-generation id 100000");
  }
  ExpectCreateError(ByteLevelSpec({}, "bert-wordpiece"),
                    "unsupported pre-tokenizer 'bert-wordpiece'");
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.token_types.pop_back();
    ExpectCreateError(spec, "258 token types for 259 tokens");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.token_types[5] = 9;
    ExpectCreateError(spec, "token 5 has unknown token type 9");
  }
  {
    TokenizerSpec spec = ByteLevelSpec({});
    spec.bos_id = -1;
    spec.add_bos = true;
    ExpectCreateError(spec, "no bos_id");
  }
  ExpectCreateError(TokenizerSpec{}, "no tokens");
  {
    TokenizerSpec spec = SentencePieceSpec(kPieces);
    spec.scores.clear();
    ExpectCreateError(spec, "one score per token");
  }
  {
    TokenizerSpec spec = SentencePieceSpec(kPieces);
    spec.tokens[3] = "<0xZZ>";
    ExpectCreateError(spec, "not of the form <0xXX>");
  }
}

}  // namespace
}  // namespace riskkv
