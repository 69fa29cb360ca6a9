// Token ids against goldens from independent implementations (HF tokenizers, sentencepiece,
// cross-checked with llama.cpp) made by tests/tools/tokenizer_reference.py, for every way a
// tokenizer can be loaded: GGUF metadata values, a GGUF file, tokenizer.json, the real model.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/tokenizer/tokenizer_test_util.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::TestdataDir;

const json& Golden() {
  static const json* golden =
      new json(testing::ReadJsonFile(TestdataDir() / "tokenizer_golden.json"));
  return *golden;
}

const json* GoldenEntry(const std::string& name) {
  const json& golden = Golden();
  if (!golden.is_object()) return nullptr;
  for (const json& entry : golden["tokenizers"]) {
    if (entry["name"] == name) return &entry;
  }
  return nullptr;
}

// Where a tokenizer is loaded from.
enum class Source {
  kGgufValues,       // gguf_tokenizer.json turned into a spec by the test itself
  kGgufFile,         // the same values written as a GGUF file, read by SpecFromGguf
  kTokenizerJson,    // tokenizer.json through SpecFromTokenizerJson
  kModelGguf,        // the real SmolLM2 GGUF (DefaultModelPath)
  kTinyModelGguf,    // the tiny model GGUF that make_testdata.sh builds around the tokenizer
  kTinyModelHfJson,  // the tiny Qwen2 model's HF tokenizer.json
};

struct Case {
  const char* tokenizer;  // golden entry name
  Source source;
  const char* tiny_path = "";  // relative to TestdataDir(), for the tiny-model sources
};

std::string CaseName(const Case& c) {
  static const char* kSourceNames[] = {"GgufValues", "GgufFile",      "TokenizerJson",
                                       "ModelGguf",  "TinyModelGguf", "TinyModelHfJson"};
  return std::string(c.tokenizer) + "_" + kSourceNames[static_cast<int>(c.source)];
}

// Readable parameters in test listings (ctest shows them).
void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGguf(const fs::path& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(path.string());
  if (!gguf.ok()) return gguf.status();
  absl::StatusOr<TokenizerSpec> spec = Tokenizer::SpecFromGguf(**gguf);
  if (!spec.ok()) return spec.status();
  return Tokenizer::Create(*std::move(spec));
}

class TokenizerGoldenTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    entry_ = GoldenEntry(GetParam().tokenizer);
    const Source source = GetParam().source;
    if (entry_ == nullptr) {
      if (source == Source::kModelGguf && !fs::exists(testing::DefaultModelPath())) {
        GTEST_SKIP() << "no model at " << testing::DefaultModelPath();
      }
      FAIL() << "no golden entry '" << GetParam().tokenizer << "' in "
             << TestdataDir() / "tokenizer_golden.json";
    }
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer;
    switch (source) {
      case Source::kGgufValues: {
        absl::StatusOr<TokenizerSpec> spec = testing::SpecFromGgufJson(
            testing::ReadJsonFile(TestdataDir() / entry_->at("gguf_spec").get<std::string>()));
        ASSERT_TRUE(spec.ok()) << spec.status();
        tokenizer = Tokenizer::Create(*std::move(spec));
        break;
      }
      case Source::kGgufFile: {
        const json values =
            testing::ReadJsonFile(TestdataDir() / entry_->at("gguf_spec").get<std::string>());
        tokenizer = LoadGguf(testing::WriteTokenizerGguf(
            std::string(GetParam().tokenizer) + "_tokenizer.gguf", values));
        break;
      }
      case Source::kTokenizerJson: {
        const fs::path path = TestdataDir() / entry_->at("tokenizer_json").get<std::string>();
        absl::StatusOr<TokenizerSpec> spec = Tokenizer::SpecFromTokenizerJson(path.string());
        ASSERT_TRUE(spec.ok()) << spec.status();
        tokenizer = Tokenizer::Create(*std::move(spec));
        break;
      }
      case Source::kModelGguf: {
        if (!fs::exists(testing::DefaultModelPath())) {
          GTEST_SKIP() << "no model at " << testing::DefaultModelPath();
        }
        tokenizer = LoadGguf(testing::DefaultModelPath());
        break;
      }
      case Source::kTinyModelGguf:
      case Source::kTinyModelHfJson: {
        const fs::path path = TestdataDir() / GetParam().tiny_path;
        if (!fs::exists(path)) GTEST_SKIP() << path << " not generated";
        if (source == Source::kTinyModelGguf) {
          tokenizer = LoadGguf(path);
        } else {
          absl::StatusOr<TokenizerSpec> spec = Tokenizer::SpecFromTokenizerJson(path.string());
          ASSERT_TRUE(spec.ok()) << spec.status();
          tokenizer = Tokenizer::Create(*std::move(spec));
        }
        break;
      }
    }
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
  }

  const std::string& Text(const json& encoding) const {
    return Golden()["texts"][encoding["text"].get<size_t>()]["text"].get_ref<const std::string&>();
  }
  std::string TextName(const json& encoding) const {
    return Golden()["texts"][encoding["text"].get<size_t>()]["name"];
  }
  bool IsSentencePiece() const {
    return tokenizer_->spec().kind == TokenizerSpec::Kind::kSentencePiece;
  }

  const json* entry_ = nullptr;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(TokenizerGoldenTest, EncodeMatchesReference) {
  int checked = 0;
  for (const json& encoding : entry_->at("encodings")) {
    const bool parse_special = encoding["parse_special"];
    const auto expected = encoding["ids"].get<std::vector<int32_t>>();
    absl::StatusOr<std::vector<int32_t>> ids =
        tokenizer_->Encode(Text(encoding), /*add_special=*/false, parse_special);
    ASSERT_TRUE(ids.ok()) << TextName(encoding) << ": " << ids.status();
    EXPECT_EQ(testing::DescribeIdMismatch(expected, *ids), "")
        << TextName(encoding) << " parse_special=" << parse_special << " ("
        << entry_->at("reference").get<std::string>() << ")";
    ++checked;
  }
  EXPECT_GE(checked, 40);
}

TEST_P(TokenizerGoldenTest, AddSpecialPrependsBosOnlyWhenSpecSaysSo) {
  const std::string text = "Hello world";
  absl::StatusOr<std::vector<int32_t>> plain = tokenizer_->Encode(text, false, true);
  absl::StatusOr<std::vector<int32_t>> with = tokenizer_->Encode(text, true, true);
  ASSERT_TRUE(plain.ok() && with.ok());
  std::vector<int32_t> expected = *plain;
  if (tokenizer_->spec().add_bos) expected.insert(expected.begin(), tokenizer_->bos_id());
  EXPECT_EQ(*with, expected);
}

TEST_P(TokenizerGoldenTest, DecodeRoundTripsEveryText) {
  for (const json& text_entry : Golden()["texts"]) {
    const std::string name = text_entry["name"];
    // Plain text always comes back byte for byte (SentencePiece drops only its own prefix space),
    // in the tokenizer's normal form.
    absl::StatusOr<std::string> normal = Normalize(
        tokenizer_->spec().normalization, text_entry["text"].get_ref<const std::string&>());
    ASSERT_TRUE(normal.ok()) << name << ": " << normal.status();
    const std::string& text = *normal;
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, true, false);
    ASSERT_TRUE(ids.ok()) << name << ": " << ids.status();
    absl::StatusOr<std::string> decoded = tokenizer_->Decode(*ids);
    ASSERT_TRUE(decoded.ok()) << name << ": " << decoded.status();
    EXPECT_EQ(*decoded, text) << name;
    // With special tokens parsed and rendered back, byte-level BPE is exact too; SentencePiece
    // adds a prefix space after each special token, which decoding keeps.
    if (IsSentencePiece()) continue;
    ids = tokenizer_->Encode(text, false, true);
    ASSERT_TRUE(ids.ok()) << name << ": " << ids.status();
    decoded = tokenizer_->Decode(*ids, /*render_special=*/true);
    ASSERT_TRUE(decoded.ok()) << name << ": " << decoded.status();
    EXPECT_EQ(*decoded, text) << name;
  }
}

TEST_P(TokenizerGoldenTest, TokenBytesConcatenateToDecode) {
  for (const json& encoding : entry_->at("encodings")) {
    const auto ids = encoding["ids"].get<std::vector<int32_t>>();
    std::string joined;
    for (int32_t id : ids) joined += tokenizer_->TokenBytes(id);
    absl::StatusOr<std::string> decoded = tokenizer_->Decode(ids, /*render_special=*/true);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (IsSentencePiece() && tokenizer_->spec().add_space_prefix && joined.starts_with(' ')) {
      joined.erase(0, 1);
    }
    EXPECT_EQ(joined, *decoded) << TextName(encoding);
  }
}

TEST_P(TokenizerGoldenTest, LongTextRoundTrips) {
  // 100 KiB of real text: every merge path at scale, and decoding gives the text back.
  std::string text;
  for (const json& t : Golden()["texts"]) {
    if (t["name"] == "jargon_long") text = t["text"];
  }
  ASSERT_FALSE(text.empty());
  while (text.size() < 100 * 1024) text += text;
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer_->Encode(text, false, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_GT(ids->size(), text.size() / 16);
  EXPECT_LT(ids->size(), text.size());
  absl::StatusOr<std::string> back = tokenizer_->Decode(*ids);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, text);
}

INSTANTIATE_TEST_SUITE_P(
    AllSources, TokenizerGoldenTest,
    ::testing::Values(
        Case{"bpe", Source::kGgufValues}, Case{"bpe", Source::kGgufFile},
        Case{"bpe", Source::kTokenizerJson}, Case{"bpe", Source::kTinyModelGguf, "tiny_llama.gguf"},
        Case{"qwen2", Source::kGgufValues}, Case{"qwen2", Source::kGgufFile},
        Case{"qwen2", Source::kTokenizerJson},
        Case{"qwen2", Source::kTinyModelGguf, "tiny_qwen2.gguf"},
        Case{"qwen2", Source::kTinyModelHfJson, "tiny_qwen2_hf/tokenizer.json"},
        Case{"llama3", Source::kGgufValues}, Case{"llama3", Source::kGgufFile},
        Case{"llama3", Source::kTokenizerJson}, Case{"spm_hf", Source::kTokenizerJson},
        Case{"spm_hf", Source::kTinyModelHfJson, "tiny_spm_hf/tokenizer.json"},
        Case{"qwen2_nfc", Source::kTokenizerJson}, Case{"qwen2_nfkc", Source::kTokenizerJson},
        Case{"spm", Source::kGgufValues}, Case{"spm", Source::kGgufFile},
        Case{"spm", Source::kTinyModelGguf, "tiny_spm.gguf"}, Case{"smollm2", Source::kModelGguf}),
    [](const ::testing::TestParamInfo<Case>& info) { return CaseName(info.param); });

}  // namespace
}  // namespace riskkv
