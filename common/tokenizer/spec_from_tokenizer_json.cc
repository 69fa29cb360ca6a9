// TokenizerSpec from a Hugging Face tokenizer.json (byte-level BPE models only), plus the
// special token names of a tokenizer_config.json beside it.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/spec_util.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace riskkv {
namespace {

using nlohmann::json;
using tokenizer_internal::AddWellKnownEndOfGenerationIds;
using tokenizer_internal::FindToken;
using tokenizer_internal::PreTokenizerNameForPattern;

absl::Status Unsupported(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(what, " is not supported"));
}

absl::StatusOr<json> ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream buffer;
  buffer << in.rdbuf();
  json j = json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

std::string TypeOf(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"];
  return j.is_null() ? "null" : "untyped";
}

bool IsNullOrEmpty(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return true;
  return j[key].is_string() && j[key].get<std::string>().empty();
}

bool BoolOr(const json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}

// A short rendering of a pre-tokenizer for error messages, e.g. "Sequence[Digits, ByteLevel]".
std::string Describe(const json& pre) {
  std::string type = TypeOf(pre);
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    std::vector<std::string> parts;
    for (const json& p : pre["pretokenizers"]) parts.push_back(Describe(p));
    return absl::StrCat("Sequence[", absl::StrJoin(parts, ", "), "]");
  }
  if (type == "Split" && pre.contains("pattern") && pre["pattern"].is_object()) {
    for (const char* kind : {"Regex", "String"}) {
      if (pre["pattern"].contains(kind) && pre["pattern"][kind].is_string()) {
        return absl::StrCat("Split(", kind, " \"", pre["pattern"][kind].get<std::string>(), "\")");
      }
    }
  }
  return type;
}

// Checks a ByteLevel pre-tokenizer; *use_regex says whether it splits with the GPT-2 regex.
absl::Status CheckByteLevel(const json& pre, bool* use_regex) {
  if (BoolOr(pre, "add_prefix_space", false)) {
    return Unsupported("ByteLevel pre-tokenizer with add_prefix_space=true");
  }
  *use_regex = BoolOr(pre, "use_regex", true);
  return absl::OkStatus();
}

// Maps the pre-tokenizer structures of GPT-2, SmolLM, Qwen2 and Llama 3 to TokenizerSpec::pre.
absl::StatusOr<std::string> DetectPreTokenizer(const json& pre) {
  const auto unsupported = [&pre]() {
    return Unsupported(absl::StrCat("pre-tokenizer ", Describe(pre)));
  };
  bool use_regex = false;
  if (TypeOf(pre) == "ByteLevel") {
    RETURN_IF_ERROR(CheckByteLevel(pre, &use_regex));
    if (!use_regex) return unsupported();
    return std::string("gpt2");
  }
  if (TypeOf(pre) != "Sequence" || !pre.contains("pretokenizers") ||
      !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 2 ||
      TypeOf(pre["pretokenizers"][1]) != "ByteLevel") {
    return unsupported();
  }
  const json& first = pre["pretokenizers"][0];
  RETURN_IF_ERROR(CheckByteLevel(pre["pretokenizers"][1], &use_regex));
  if (TypeOf(first) == "Digits") {
    if (!BoolOr(first, "individual_digits", false) || !use_regex) return unsupported();
    return std::string("smollm");
  }
  if (TypeOf(first) == "Split" && !use_regex) {
    const json& pattern = first.value("pattern", json());
    const bool isolated = first.value("behavior", std::string()) == "Isolated";
    if (!isolated || BoolOr(first, "invert", false) || !pattern.is_object() ||
        !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      return unsupported();
    }
    std::string_view name = PreTokenizerNameForPattern(pattern["Regex"].get<std::string>());
    if (name.empty()) return unsupported();
    return std::string(name);
  }
  return unsupported();
}

// The Unicode normal form a normalizer applies: null, NFC/NFD/NFKC/NFKD, or a Sequence holding
// at most one of them. Normalizers that change text otherwise (Lowercase, Strip, Replace,
// Prepend, BertNormalizer, ...) are refused by name.
absl::StatusOr<Normalization> ReadNormalizer(const json& normalizer) {
  if (normalizer.is_null()) return Normalization::kNone;
  const std::string type = TypeOf(normalizer);
  if (type == "Sequence") {
    if (!normalizer.contains("normalizers") || !normalizer["normalizers"].is_array()) {
      return absl::InvalidArgumentError("normalizer Sequence without a \"normalizers\" list");
    }
    Normalization form = Normalization::kNone;
    for (const json& part : normalizer["normalizers"]) {
      ASSIGN_OR_RETURN(Normalization one, ReadNormalizer(part));
      if (one == Normalization::kNone) continue;
      if (form != Normalization::kNone && form != one) {
        return Unsupported(absl::StrCat("normalizer Sequence of ", NormalizationName(form), " and ",
                                        NormalizationName(one)));
      }
      form = one;
    }
    return form;
  }
  std::optional<Normalization> form = NormalizationFromName(type);
  if (!form || *form == Normalization::kNone) {
    return Unsupported(absl::StrCat("normalizer ", type));
  }
  return *form;
}

absl::Status CheckModelOptions(const json& model, TokenizerSpec* spec) {
  if (model.contains("dropout") && !model["dropout"].is_null()) {
    return Unsupported("BPE dropout");
  }
  if (!IsNullOrEmpty(model, "continuing_subword_prefix")) {
    return Unsupported("BPE continuing_subword_prefix");
  }
  if (!IsNullOrEmpty(model, "end_of_word_suffix")) return Unsupported("BPE end_of_word_suffix");
  if (BoolOr(model, "byte_fallback", false)) return Unsupported("BPE byte_fallback");
  spec->ignore_merges = BoolOr(model, "ignore_merges", false);
  return absl::OkStatus();
}

// Fills tokens and token types from model.vocab and added_tokens; ids must be 0..n-1.
absl::Status ReadVocabulary(const json& root, const json& model, TokenizerSpec* spec) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError("model.vocab is missing or not an object");
  }
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;  // id -> (text, type)
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      return absl::InvalidArgumentError(absl::StrCat("vocab entry '", text, "' has no valid id"));
    }
    if (!by_id.try_emplace(id.get<int64_t>(), text, tokenizer_internal::kTypeNormal).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab id ", id.get<int64_t>(), " is used by two tokens"));
    }
  }
  if (root.contains("added_tokens") && !root["added_tokens"].is_null()) {
    if (!root["added_tokens"].is_array())
      return absl::InvalidArgumentError("added_tokens is not a list");
    for (const json& added : root["added_tokens"]) {
      if (!added.is_object() || !added.contains("id") || !added["id"].is_number_integer() ||
          !added.contains("content") || !added["content"].is_string() ||
          added["id"].get<int64_t>() < 0 || added["id"].get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("malformed added_tokens entry ", added.dump()));
      }
      const bool special = BoolOr(added, "special", false);
      by_id[added["id"].get<int64_t>()] = {
          added["content"].get<std::string>(),
          special ? tokenizer_internal::kTypeControl : tokenizer_internal::kTypeUserDefined};
    }
  }
  if (by_id.empty()) return absl::InvalidArgumentError("the vocabulary is empty");
  int64_t expected = 0;
  for (auto& [id, entry] : by_id) {
    if (id != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("the vocabulary has no token with id ", expected));
    }
    spec->tokens.push_back(std::move(entry.first));
    spec->token_types.push_back(entry.second);
    ++expected;
  }
  return absl::OkStatus();
}

absl::Status ReadMerges(const json& model, TokenizerSpec* spec) {
  if (!model.contains("merges")) return absl::OkStatus();
  if (!model["merges"].is_array()) return absl::InvalidArgumentError("model.merges is not a list");
  spec->merges.reserve(model["merges"].size());
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      spec->merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec->merges.push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("malformed merge ", m.dump()));
    }
  }
  return absl::OkStatus();
}

// A leading special token in a TemplateProcessing "single" template becomes the BOS.
absl::Status ReadPostProcessor(const json& post, TokenizerSpec* spec) {
  const std::string type = TypeOf(post);
  if (type == "null" || type == "ByteLevel") return absl::OkStatus();
  if (type == "Sequence" && post.contains("processors") && post["processors"].is_array()) {
    for (const json& p : post["processors"]) RETURN_IF_ERROR(ReadPostProcessor(p, spec));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing" || !post.contains("single") || !post["single"].is_array()) {
    return Unsupported(absl::StrCat("post-processor ", type));
  }
  std::vector<std::string> before;
  bool seen_text = false;
  for (const json& piece : post["single"]) {
    if (piece.contains("Sequence")) {
      seen_text = true;
    } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id") &&
               piece["SpecialToken"]["id"].is_string()) {
      if (seen_text) return Unsupported("post-processor template adding tokens after the text");
      before.push_back(piece["SpecialToken"]["id"].get<std::string>());
    } else {
      return Unsupported(absl::StrCat("post-processor template piece ", piece.dump()));
    }
  }
  if (before.size() > 1) return Unsupported("post-processor template adding several tokens");
  if (before.size() == 1) {
    spec->bos_id = FindToken(*spec, before[0]);
    if (spec->bos_id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("post-processor token '", before[0], "' is not in the vocabulary"));
    }
    spec->add_bos = true;
  }
  return absl::OkStatus();
}

// Token text of a tokenizer_config.json entry: a string or an AddedToken object.
std::optional<std::string> ConfigToken(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

absl::Status ReadTokenizerConfig(const std::filesystem::path& path, TokenizerSpec* spec) {
  ASSIGN_OR_RETURN(json config, ReadJson(path.string()));
  const std::pair<const char*, int32_t*> fields[] = {{"bos_token", &spec->bos_id},
                                                     {"eos_token", &spec->eos_id},
                                                     {"unk_token", &spec->unk_id},
                                                     {"pad_token", &spec->pad_id}};
  for (const auto& [key, id] : fields) {
    std::optional<std::string> text = ConfigToken(config, key);
    if (!text) continue;
    *id = FindToken(*spec, *text);
    if (*id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": ", key, " '", *text, "' is not in the vocabulary"));
    }
  }
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    spec->add_bos = config["add_bos_token"].get<bool>();
  }
  return absl::OkStatus();
}

// A pair's rank in model.merges; "left right" strings and [left, right] lists.
absl::StatusOr<std::pair<std::string, std::string>> MergePair(const json& m) {
  if (m.is_string()) {
    const std::string text = m.get<std::string>();
    const size_t space = text.find(' ');
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("malformed merge ", m.dump()));
    }
    return std::make_pair(text.substr(0, space), text.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return absl::InvalidArgumentError(absl::StrCat("malformed merge ", m.dump()));
}

// The SentencePiece models Hugging Face converts (TinyLlama, Phi-3, Llama 2): a BPE with
// byte_fallback behind the normalizers Prepend("▁") and Replace(" ", "▁"), no pre-tokenizer.
// Read as a SentencePiece spec: <0xXX> pieces are byte tokens, and each piece's score is minus
// the rank of the first merge that makes it, so merging by score follows the merge order.
absl::StatusOr<TokenizerSpec> ParseByteFallbackBpe(const json& root, const json& model) {
  constexpr char kMark[] = "\xe2\x96\x81";  // U+2581, SentencePiece's space
  const json& norm = root.contains("normalizer") ? root["normalizer"] : json();
  const bool legacy =
      TypeOf(norm) == "Sequence" && norm.contains("normalizers") &&
      norm["normalizers"].is_array() && norm["normalizers"].size() == 2 &&
      TypeOf(norm["normalizers"][0]) == "Prepend" &&
      norm["normalizers"][0].value("prepend", std::string()) == kMark &&
      TypeOf(norm["normalizers"][1]) == "Replace" &&
      norm["normalizers"][1].value("pattern", json()).value("String", std::string()) == " " &&
      norm["normalizers"][1].value("content", std::string()) == kMark;
  if (!legacy) {
    return Unsupported(absl::StrCat("byte-fallback BPE behind normalizer ", TypeOf(norm),
                                    " (only Sequence[Prepend(\"\u2581\"), Replace(\" \", "
                                    "\"\u2581\")], as Hugging Face converts SentencePiece)"));
  }
  if (root.contains("pre_tokenizer") && !root["pre_tokenizer"].is_null()) {
    return Unsupported(
        absl::StrCat("byte-fallback BPE with pre-tokenizer ", Describe(root["pre_tokenizer"])));
  }
  if (model.contains("dropout") && !model["dropout"].is_null()) return Unsupported("BPE dropout");
  TokenizerSpec spec;
  spec.kind = TokenizerSpec::Kind::kSentencePiece;
  spec.add_space_prefix = true;
  RETURN_IF_ERROR(ReadVocabulary(root, model, &spec));
  spec.scores.assign(spec.tokens.size(), 0.0f);
  std::vector<bool> made(spec.tokens.size(), false);
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(spec.tokens.size());
  for (size_t id = 0; id < spec.tokens.size(); ++id) ids.emplace(spec.tokens[id], id);
  auto find = [&ids](const std::string& text) {
    auto it = ids.find(text);
    return it == ids.end() ? -1 : it->second;
  };
  if (model.contains("merges")) {
    if (!model["merges"].is_array()) {
      return absl::InvalidArgumentError("model.merges is not a list");
    }
    int64_t rank = 0;
    for (const json& m : model["merges"]) {
      ASSIGN_OR_RETURN(auto pair, MergePair(m));
      const int32_t id = find(pair.first + pair.second);
      if (id < 0 || find(pair.first) < 0 || find(pair.second) < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("merge ", m.dump(), " joins or makes a token not in the vocabulary"));
      }
      if (!made[id]) {
        made[id] = true;
        spec.scores[id] = -static_cast<float>(rank);
      }
      ++rank;
    }
  }
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    const std::string& t = spec.tokens[id];
    if (spec.token_types[id] == tokenizer_internal::kTypeNormal && t.size() == 6 &&
        t.starts_with("<0x") && t.ends_with(">")) {
      spec.token_types[id] = tokenizer_internal::kTypeByte;
    }
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    spec.unk_id = FindToken(spec, model["unk_token"].get<std::string>());
    if (spec.unk_id >= 0) spec.token_types[spec.unk_id] = tokenizer_internal::kTypeUnknown;
  }
  return spec;
}

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(const json& root, const std::string& path) {
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object()) {
    return absl::InvalidArgumentError("no \"model\" object");
  }
  const json& model = root["model"];
  const std::string model_type = model.contains("type") ? TypeOf(model) : "BPE";
  if (model_type != "BPE") {
    return Unsupported(absl::StrCat("model type '", model_type, "' (only BPE)"));
  }
  TokenizerSpec spec;
  if (BoolOr(model, "byte_fallback", false)) {
    ASSIGN_OR_RETURN(spec, ParseByteFallbackBpe(root, model));
  } else {
    spec.kind = TokenizerSpec::Kind::kByteLevelBpe;
    RETURN_IF_ERROR(CheckModelOptions(model, &spec));
    if (root.contains("normalizer")) {
      ASSIGN_OR_RETURN(spec.normalization, ReadNormalizer(root["normalizer"]));
    }
    if (!root.contains("pre_tokenizer") || root["pre_tokenizer"].is_null()) {
      return Unsupported("a BPE model without a ByteLevel pre-tokenizer");
    }
    ASSIGN_OR_RETURN(spec.pre, DetectPreTokenizer(root["pre_tokenizer"]));
    if (root.contains("decoder") && !root["decoder"].is_null() &&
        TypeOf(root["decoder"]) != "ByteLevel") {
      return Unsupported(absl::StrCat("decoder ", TypeOf(root["decoder"])));
    }
    RETURN_IF_ERROR(ReadVocabulary(root, model, &spec));
    RETURN_IF_ERROR(ReadMerges(model, &spec));
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      spec.unk_id = FindToken(spec, model["unk_token"].get<std::string>());
    }
  }
  if (root.contains("post_processor")) {
    RETURN_IF_ERROR(ReadPostProcessor(root["post_processor"], &spec));
  }
  const std::filesystem::path config =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    RETURN_IF_ERROR(ReadTokenizerConfig(config, &spec));
  } else if (spec.eos_id < 0) {
    // Without a config, the chat end-of-turn marker is the best guess for EOS.
    for (std::string_view name : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>"}) {
      const int32_t id = FindToken(spec, name);
      if (id >= 0 && spec.token_types[id] == tokenizer_internal::kTypeControl) {
        spec.eos_id = id;
        break;
      }
    }
  }
  AddWellKnownEndOfGenerationIds(&spec);
  return spec;
}

}  // namespace

absl::StatusOr<TokenizerSpec> Tokenizer::SpecFromTokenizerJson(const std::string& path) {
  ASSIGN_OR_RETURN(json root, ReadJson(path));
  // The checks above keep to the types they test, but nlohmann reports anything they missed by
  // throwing; turn that into a Status rather than letting it escape.
  try {
    absl::StatusOr<TokenizerSpec> spec = ParseTokenizerJson(root, path);
    if (!spec.ok()) {
      return absl::Status(spec.status().code(), absl::StrCat(path, ": ", spec.status().message()));
    }
    return spec;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

}  // namespace riskkv
