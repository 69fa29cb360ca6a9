// The spec readers: GGUF metadata and tokenizer.json must give the same spec as the values the
// test data was written from, and malformed files must fail with an error naming the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/formats/gguf_file.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/common/formats/gguf_test_writer.h"
#include "tests/common/tokenizer/tokenizer_test_util.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using testing::TestdataDir;

json GgufValues(const std::string& tokenizer) {
  return testing::ReadJsonFile(TestdataDir() / "tokenizers" / tokenizer / "gguf_tokenizer.json");
}

absl::StatusOr<TokenizerSpec> SpecFromGgufPath(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> gguf = GgufFile::Open(path);
  if (!gguf.ok()) return gguf.status();
  return Tokenizer::SpecFromGguf(**gguf);
}

// llama.cpp writes Llama 3's pre-tokenizer as "llama-bpe"; tokenizer.json gives its regex.
std::string CanonicalPre(const std::string& pre) { return pre == "llama-bpe" ? "llama3" : pre; }

void ExpectSameSpec(const TokenizerSpec& a, const TokenizerSpec& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.token_types, b.token_types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.scores, b.scores);
  if (a.kind == TokenizerSpec::Kind::kByteLevelBpe) {
    EXPECT_EQ(CanonicalPre(a.pre), CanonicalPre(b.pre));
    EXPECT_EQ(a.ignore_merges, b.ignore_merges);
  }
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
  EXPECT_EQ(a.unk_id, b.unk_id);
  EXPECT_EQ(a.pad_id, b.pad_id);
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.add_space_prefix, b.add_space_prefix);
}

TEST(SpecFromGgufTest, ReadsWhatWasWritten) {
  for (const std::string name : {"bpe", "qwen2", "llama3", "spm"}) {
    SCOPED_TRACE(name);
    const json values = GgufValues(name);
    absl::StatusOr<TokenizerSpec> expected = testing::SpecFromGgufJson(values);
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<TokenizerSpec> spec =
        SpecFromGgufPath(testing::WriteTokenizerGguf(name + "_spec.gguf", values));
    ASSERT_TRUE(spec.ok()) << spec.status();
    ExpectSameSpec(*spec, *expected);
  }
}

TEST(SpecFromGgufTest, FindsEndOfGenerationTokens) {
  absl::StatusOr<TokenizerSpec> spec =
      SpecFromGgufPath(testing::WriteTokenizerGguf("bpe_eog.gguf", GgufValues("bpe")));
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(*spec);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->IsEndOfGeneration(2));   // <|im_end|>, the EOS
  EXPECT_TRUE((*t)->IsEndOfGeneration(0));   // <|endoftext|>
  EXPECT_FALSE((*t)->IsEndOfGeneration(1));  // <|im_start|>
}

TEST(SpecFromGgufTest, RealModel) {
  if (!fs::exists(testing::DefaultModelPath())) GTEST_SKIP() << "no model";
  absl::StatusOr<TokenizerSpec> spec = SpecFromGgufPath(testing::DefaultModelPath().string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind, TokenizerSpec::Kind::kByteLevelBpe);
  EXPECT_EQ(spec->pre, "smollm");
  EXPECT_EQ(spec->tokens.size(), 49152u);
  EXPECT_EQ(spec->merges.size(), 48900u);
  EXPECT_EQ(spec->bos_id, 1);
  EXPECT_EQ(spec->eos_id, 2);
  EXPECT_FALSE(spec->add_bos);
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Create(*std::move(spec));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->IsEndOfGeneration(0));
  EXPECT_EQ(*(*t)->Decode(std::vector<int32_t>{1}, true), "<|im_start|>");
}

// A GGUF with the bpe tokenizer's values, changed by `edit`.
absl::StatusOr<TokenizerSpec> EditedGgufSpec(const std::string& name,
                                             const std::function<void(json&)>& edit) {
  json values = GgufValues("bpe");
  edit(values);
  return SpecFromGgufPath(testing::WriteTokenizerGguf(name, values));
}

TEST(SpecFromGgufTest, RejectsUnknownModel) {
  absl::StatusOr<TokenizerSpec> spec =
      EditedGgufSpec("bert.gguf", [](json& v) { v["model"] = "bert"; });
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("unsupported tokenizer model 'bert'"));
}

TEST(SpecFromGgufTest, MissingTokenizerIsNotFound) {
  testing::GgufTestWriter w;
  w.AddString("general.architecture", "llama");
  absl::StatusOr<TokenizerSpec> spec =
      SpecFromGgufPath(testing::WriteTempFile("no_tokenizer.gguf", w.Build()));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(spec.status().message(), HasSubstr("tokenizer.ggml.model"));
}

TEST(SpecFromGgufTest, BadValuesFailInCreate) {
  absl::StatusOr<TokenizerSpec> spec =
      EditedGgufSpec("bad_bos.gguf", [](json& v) { v["bos_token_id"] = 600; });
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(Tokenizer::Create(*spec).status().message(), HasSubstr("bos_id 600 out of range"));

  spec = EditedGgufSpec("bad_pre.gguf", [](json& v) { v["pre"] = "mystery"; });
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(Tokenizer::Create(*spec).status().message(),
              HasSubstr("unsupported pre-tokenizer 'mystery'"));

  spec = EditedGgufSpec("bad_merge.gguf", [](json& v) { v["merges"].push_back("Ġ nosuch"); });
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(Tokenizer::Create(*spec).status().message(),
              HasSubstr("'nosuch' is not in the vocabulary"));

  spec = EditedGgufSpec("short_types.gguf", [](json& v) { v["token_type"].erase(0); });
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(Tokenizer::Create(*spec).status().message(), HasSubstr("511 token types"));
}

TEST(SpecFromGgufTest, WrongValueTypeNamesTheKey) {
  testing::GgufTestWriter w;
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.tokens", "not an array");
  absl::StatusOr<TokenizerSpec> spec =
      SpecFromGgufPath(testing::WriteTempFile("tokens_string.gguf", w.Build()));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("tokenizer.ggml.tokens"));
}

TEST(SpecFromTokenizerJsonTest, MatchesGgufValues) {
  for (const std::string name : {"bpe", "qwen2", "llama3"}) {
    SCOPED_TRACE(name);
    absl::StatusOr<TokenizerSpec> expected = testing::SpecFromGgufJson(GgufValues(name));
    ASSERT_TRUE(expected.ok()) << expected.status();
    absl::StatusOr<TokenizerSpec> spec = Tokenizer::SpecFromTokenizerJson(
        (TestdataDir() / "tokenizers" / name / "tokenizer.json").string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    ExpectSameSpec(*spec, *expected);
  }
}

// The bpe tokenizer.json changed by `edit`, written to its own directory (optionally with a
// tokenizer_config.json) and read back.
absl::StatusOr<TokenizerSpec> EditedJsonSpec(const std::string& name,
                                             const std::function<void(json&)>& edit,
                                             const json& config = nullptr) {
  json root = testing::ReadJsonFile(TestdataDir() / "tokenizers" / "bpe" / "tokenizer.json");
  edit(root);
  const fs::path dir = testing::ProcessTempDir() / name;
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << root.dump();
  if (!config.is_null()) std::ofstream(dir / "tokenizer_config.json") << config.dump();
  return Tokenizer::SpecFromTokenizerJson((dir / "tokenizer.json").string());
}

void ExpectJsonError(const std::string& name, const std::function<void(json&)>& edit,
                     const std::string& fragment) {
  absl::StatusOr<TokenizerSpec> spec = EditedJsonSpec(name, edit);
  ASSERT_FALSE(spec.ok()) << name << " was accepted";
  EXPECT_THAT(spec.status().message(), HasSubstr(fragment)) << name;
}

TEST(SpecFromTokenizerJsonTest, UnsupportedStructuresAreNamed) {
  ExpectJsonError(
      "wordpiece", [](json& j) { j["model"]["type"] = "WordPiece"; }, "model type 'WordPiece'");
  ExpectJsonError(
      "whitespace",
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Whitespace"}};
      },
      "pre-tokenizer Whitespace is not supported");
  ExpectJsonError(
      "split_regex",
      [](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
      },
      "Split(Regex \"\\w+\")");
  ExpectJsonError(
      "prefix_space",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
      "add_prefix_space=true");
  ExpectJsonError(
      "lowercase",
      [](json& j) {
        j["normalizer"] = {{"type", "Lowercase"}};
      },
      "normalizer Lowercase is not supported");
  ExpectJsonError(
      "nfc_then_replace",
      [](json& j) {
        j["normalizer"] = {{"type", "Sequence"},
                           {"normalizers", {{{"type", "NFC"}}, {{"type", "Replace"}}}}};
      },
      "normalizer Replace is not supported");
  ExpectJsonError(
      "nfc_and_nfkd",
      [](json& j) {
        j["normalizer"] = {{"type", "Sequence"},
                           {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKD"}}}}};
      },
      "normalizer Sequence of NFC and NFKD");
  ExpectJsonError(
      "sequence_without_list",
      [](json& j) {
        j["normalizer"] = {{"type", "Sequence"}};
      },
      "without a \"normalizers\" list");
  ExpectJsonError(
      "decoder",
      [](json& j) {
        j["decoder"] = {{"type", "WordPiece"}};
      },
      "decoder WordPiece");
  ExpectJsonError(
      "dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "BPE dropout");
  ExpectJsonError(
      "gap", [](json& j) { j["model"]["vocab"].erase("a"); }, "no token with id");
  ExpectJsonError(
      "merge_shape",
      [](json& j) {
        j["model"]["merges"].push_back(json::array({1, 2}));
      },
      "malformed merge");
  ExpectJsonError(
      "duplicate_id", [](json& j) { j["model"]["vocab"]["zz_dup"] = 7; },
      "vocab id 7 is used by two tokens");
  ExpectJsonError(
      "vocab_type", [](json& j) { j["model"]["vocab"] = json::array(); }, "model.vocab");
  ExpectJsonError(
      "eos_after_text",
      [](json& j) {
        j["post_processor"] = {{"type", "TemplateProcessing"},
                               {"single",
                                {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                 {{"SpecialToken", {{"id", "<|im_end|>"}, {"type_id", 0}}}}}}};
      },
      "adding tokens after the text");
}

TEST(SpecFromTokenizerJsonTest, UnicodeNormalizersAreRead) {
  const std::pair<json, Normalization> cases[] = {
      {nullptr, Normalization::kNone},
      {{{"type", "NFC"}}, Normalization::kNfc},
      {{{"type", "NFD"}}, Normalization::kNfd},
      {{{"type", "NFKC"}}, Normalization::kNfkc},
      {{{"type", "NFKD"}}, Normalization::kNfkd},
      {{{"type", "Sequence"}, {"normalizers", json::array()}}, Normalization::kNone},
      {{{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}}}}, Normalization::kNfkc},
  };
  int i = 0;
  for (const auto& [normalizer, form] : cases) {
    absl::StatusOr<TokenizerSpec> spec = EditedJsonSpec(
        absl::StrCat("normalizer_", i++), [&](json& j) { j["normalizer"] = normalizer; });
    ASSERT_TRUE(spec.ok()) << normalizer.dump() << ": " << spec.status();
    EXPECT_EQ(spec->normalization, form) << normalizer.dump();
  }
}

TEST(NormalizeTest, FourFormsOfOneText) {
  // "é" decomposed, the "ﬁ" ligature and a Hangul syllable, checked against Python's
  // unicodedata.normalize.
  const std::string text = "e\u0301 \uFB01 \uD55C";
  EXPECT_EQ(*Normalize(Normalization::kNfc, text), "\u00E9 \uFB01 \uD55C");
  EXPECT_EQ(*Normalize(Normalization::kNfd, text), "e\u0301 \uFB01 \u1112\u1161\u11AB");
  EXPECT_EQ(*Normalize(Normalization::kNfkc, text), "\u00E9 fi \uD55C");
  EXPECT_EQ(*Normalize(Normalization::kNfkd, text), "e\u0301 fi \u1112\u1161\u11AB");
  EXPECT_EQ(*Normalize(Normalization::kNone, text), text);
  EXPECT_EQ(*Normalize(Normalization::kNfc, ""), "");
}

// The SentencePiece model as Hugging Face converts it (TinyLlama's and Phi-3's tokenizer.json)
// reads back as the GGUF form's pieces and types, with scores in the merges' order.
TEST(SpecFromTokenizerJsonTest, ByteFallbackBpeIsReadAsSentencePiece) {
  absl::StatusOr<TokenizerSpec> expected = testing::SpecFromGgufJson(GgufValues("spm"));
  ASSERT_TRUE(expected.ok()) << expected.status();
  const fs::path path = TestdataDir() / "tokenizers" / "spm_hf" / "tokenizer.json";
  absl::StatusOr<TokenizerSpec> spec = Tokenizer::SpecFromTokenizerJson(path.string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->kind, TokenizerSpec::Kind::kSentencePiece);
  EXPECT_EQ(spec->tokens, expected->tokens);
  EXPECT_EQ(spec->token_types, expected->token_types);
  EXPECT_TRUE(spec->add_space_prefix);
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->bos_id, expected->bos_id);
  EXPECT_EQ(spec->eos_id, expected->eos_id);
  EXPECT_EQ(spec->unk_id, expected->unk_id);

  json root = testing::ReadJsonFile(path);
  const fs::path dir = testing::ProcessTempDir() / "spm_metaspace";
  fs::create_directories(dir);
  root["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  std::ofstream(dir / "tokenizer.json") << root.dump();
  absl::StatusOr<TokenizerSpec> metaspace =
      Tokenizer::SpecFromTokenizerJson((dir / "tokenizer.json").string());
  ASSERT_FALSE(metaspace.ok());
  EXPECT_THAT(metaspace.status().message(),
              HasSubstr("byte-fallback BPE with pre-tokenizer Metaspace"));
  root["pre_tokenizer"] = nullptr;
  root["normalizer"] = {{"type", "NFKC"}};
  std::ofstream(dir / "tokenizer.json", std::ios::trunc) << root.dump();
  EXPECT_THAT(
      Tokenizer::SpecFromTokenizerJson((dir / "tokenizer.json").string()).status().message(),
      HasSubstr("byte-fallback BPE behind normalizer NFKC"));
}

TEST(SpecFromTokenizerJsonTest, MergeOfUnknownTokenFailsInCreate) {
  absl::StatusOr<TokenizerSpec> spec = EditedJsonSpec("unknown_merge", [](json& j) {
    j["model"]["merges"].push_back(json::array({"Ġ", "zzz"}));
  });
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(Tokenizer::Create(*spec).status().message(),
              HasSubstr("'zzz' is not in the vocabulary"));
}

TEST(SpecFromTokenizerJsonTest, StringMergesAndTemplateBos) {
  absl::StatusOr<TokenizerSpec> spec = EditedJsonSpec("string_merges", [](json& j) {
    json merges = json::array();
    for (const json& m : j["model"]["merges"]) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
    j["model"]["merges"] = merges;
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single",
                            {{{"SpecialToken", {{"id", "<|im_start|>"}, {"type_id", 0}}}},
                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  });
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TokenizerSpec> expected = testing::SpecFromGgufJson(GgufValues("bpe"));
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(spec->merges, expected->merges);
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->bos_id, 1);
  // No tokenizer_config.json: EOS is guessed from the chat end-of-turn token.
  EXPECT_EQ(spec->eos_id, 2);
}

TEST(SpecFromTokenizerJsonTest, ConfigNamesMustExist) {
  absl::StatusOr<TokenizerSpec> spec = EditedJsonSpec(
      "bad_config", [](json&) {}, json{{"eos_token", "<|nope|>"}});
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("eos_token '<|nope|>'"));
  spec = EditedJsonSpec(
      "object_config", [](json&) {},
      json{{"eos_token", {{"content", "<|endoftext|>"}}}, {"add_bos_token", false}});
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->eos_id, 0);
}

TEST(SpecFromTokenizerJsonTest, UnreadableFiles) {
  absl::StatusOr<TokenizerSpec> spec =
      Tokenizer::SpecFromTokenizerJson((testing::ProcessTempDir() / "absent.json").string());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  const fs::path garbage = testing::ProcessTempDir() / "garbage" / "tokenizer.json";
  fs::create_directories(garbage.parent_path());
  std::ofstream(garbage) << "{\"model\": [1, 2";
  spec = Tokenizer::SpecFromTokenizerJson(garbage.string());
  EXPECT_THAT(spec.status().message(), HasSubstr("not valid JSON"));
  std::ofstream(garbage, std::ios::trunc) << "[1, 2]";
  spec = Tokenizer::SpecFromTokenizerJson(garbage.string());
  EXPECT_THAT(spec.status().message(), HasSubstr("no \"model\" object"));
}

}  // namespace
}  // namespace riskkv
