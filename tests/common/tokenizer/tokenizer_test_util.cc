// Tokenizer test helpers.
#include "tests/common/tokenizer/tokenizer_test_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "tests/common/formats/gguf_test_writer.h"

namespace riskkv::testing {

nlohmann::json ReadJsonFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "cannot open " << path;
    return nullptr;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ADD_FAILURE() << path << " is not valid JSON";
    return nullptr;
  }
  return j;
}

absl::StatusOr<TokenizerSpec> SpecFromGgufJson(const nlohmann::json& j) {
  TokenizerSpec spec;
  const std::string model = j.at("model");
  if (model == "gpt2") {
    spec.kind = TokenizerSpec::Kind::kByteLevelBpe;
  } else if (model == "llama") {
    spec.kind = TokenizerSpec::Kind::kSentencePiece;
  } else {
    return absl::InvalidArgumentError("unknown model " + model);
  }
  spec.tokens = j.at("tokens").get<std::vector<std::string>>();
  spec.token_types = j.at("token_type").get<std::vector<int32_t>>();
  if (j.contains("scores")) spec.scores = j["scores"].get<std::vector<float>>();
  if (j.contains("merges")) spec.merges = j["merges"].get<std::vector<std::string>>();
  if (j.contains("pre")) spec.pre = j["pre"];
  // llama.cpp ties Llama 3's ignore_merges to the pre-tokenizer type; the values carry no key.
  spec.ignore_merges = spec.pre == "llama-bpe" || spec.pre == "llama3" || spec.pre == "llama-v3";
  spec.bos_id = j.value("bos_token_id", -1);
  spec.eos_id = j.value("eos_token_id", -1);
  spec.unk_id = j.value("unknown_token_id", -1);
  spec.pad_id = j.value("padding_token_id", -1);
  spec.add_bos = j.value("add_bos_token", false);
  spec.add_space_prefix = j.value("add_space_prefix", false);
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    const std::string& t = spec.tokens[i];
    if (spec.token_types[i] == 3 && static_cast<int32_t>(i) != spec.eos_id &&
        (t == "<|im_end|>" || t == "<|endoftext|>" || t == "</s>")) {
      spec.eog_ids.push_back(static_cast<int32_t>(i));
    }
  }
  return spec;
}

std::string WriteTokenizerGguf(const std::string& name, const nlohmann::json& j) {
  using Type = GgufValue::Type;
  GgufTestWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", j.at("model").get<std::string>());
  if (j.contains("pre")) w.AddString("tokenizer.ggml.pre", j["pre"].get<std::string>());
  w.AddStringArray("tokenizer.ggml.tokens", j.at("tokens").get<std::vector<std::string>>());
  if (j.contains("scores")) {
    w.AddArray<float>("tokenizer.ggml.scores", Type::kFloat32,
                      j["scores"].get<std::vector<float>>());
  }
  w.AddArray<int32_t>("tokenizer.ggml.token_type", Type::kInt32,
                      j.at("token_type").get<std::vector<int32_t>>());
  if (j.contains("merges")) {
    w.AddStringArray("tokenizer.ggml.merges", j["merges"].get<std::vector<std::string>>());
  }
  for (const char* key : {"bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"}) {
    if (j.contains(key)) {
      w.AddScalar<uint32_t>(std::string("tokenizer.ggml.") + key, Type::kUint32,
                            j[key].get<uint32_t>());
    }
  }
  for (const char* key : {"add_bos_token", "add_space_prefix"}) {
    if (j.contains(key)) {
      w.AddScalar<uint8_t>(std::string("tokenizer.ggml.") + key, Type::kBool,
                           j[key].get<bool>() ? 1 : 0);
    }
  }
  return WriteTempFile(name, w.Build());
}

std::string DescribeIdMismatch(const std::vector<int32_t>& expected,
                               const std::vector<int32_t>& actual) {
  if (expected == actual) return "";
  size_t i = 0;
  while (i < expected.size() && i < actual.size() && expected[i] == actual[i]) ++i;
  const auto slice = [i](const std::vector<int32_t>& v) {
    std::ostringstream s;
    const size_t from = i >= 3 ? i - 3 : 0;
    for (size_t k = from; k < std::min(v.size(), i + 8); ++k) s << (k == i ? " >" : " ") << v[k];
    return s.str();
  };
  std::ostringstream s;
  s << "lengths " << expected.size() << " (expected) vs " << actual.size()
    << " (actual), first difference at " << i << ": expected ..." << slice(expected)
    << " ... actual ..." << slice(actual) << " ...";
  return s.str();
}

}  // namespace riskkv::testing
