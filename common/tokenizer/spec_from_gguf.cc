// TokenizerSpec from a GGUF file's tokenizer.ggml.* metadata (llama.cpp's key names).
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/formats/gguf_file.h"
#include "common/tokenizer/spec_util.h"
#include "common/tokenizer/tokenizer.h"

namespace riskkv {
namespace {

using tokenizer_internal::AddEndOfGenerationId;
using tokenizer_internal::AddWellKnownEndOfGenerationIds;

// Prefixes a reader error with the file and key, so a bad model file is easy to locate.
absl::Status KeyError(const GgufFile& gguf, const char* key, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(gguf.path(), ": ", key, ": ", status.message()));
}

// Optional token id; 0xFFFFFFFF, which some converters write for "none", reads as -1.
absl::Status ReadTokenId(const GgufFile& gguf, const char* key, int32_t* id) {
  if (!gguf.Has(key)) return absl::OkStatus();
  absl::StatusOr<int64_t> value = gguf.GetInt(key);
  if (!value.ok()) return KeyError(gguf, key, value.status());
  if (*value == 0xFFFFFFFFll || *value == -1) {
    *id = -1;
  } else if (*value < 0 || *value > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(gguf.path(), ": ", key, " = ", *value, " is not a token id"));
  } else {
    *id = static_cast<int32_t>(*value);
  }
  return absl::OkStatus();
}

absl::Status ReadBool(const GgufFile& gguf, const char* key, bool* value) {
  if (!gguf.Has(key)) return absl::OkStatus();
  absl::StatusOr<bool> v = gguf.GetBool(key);
  if (!v.ok()) return KeyError(gguf, key, v.status());
  *value = *v;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerSpec> Tokenizer::SpecFromGguf(const GgufFile& gguf) {
  constexpr char kModel[] = "tokenizer.ggml.model";
  if (!gguf.Has(kModel)) {
    return absl::NotFoundError(absl::StrCat(gguf.path(), ": no tokenizer (", kModel, " missing)"));
  }
  absl::StatusOr<std::string> model = gguf.GetString(kModel);
  if (!model.ok()) return KeyError(gguf, kModel, model.status());

  TokenizerSpec spec;
  if (*model == "gpt2") {
    spec.kind = TokenizerSpec::Kind::kByteLevelBpe;
    spec.pre = "default";
  } else if (*model == "llama") {
    // llama.cpp's defaults for SentencePiece files that predate these keys.
    spec.kind = TokenizerSpec::Kind::kSentencePiece;
    spec.bos_id = 1;
    spec.eos_id = 2;
    spec.unk_id = 0;
    spec.add_bos = true;
    spec.add_space_prefix = true;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": unsupported tokenizer model '",
                                                   *model, "' (supported: gpt2, llama)"));
  }

  constexpr char kTokens[] = "tokenizer.ggml.tokens";
  absl::StatusOr<std::vector<std::string>> tokens = gguf.GetStringArray(kTokens);
  if (!tokens.ok()) return KeyError(gguf, kTokens, tokens.status());
  spec.tokens = *std::move(tokens);

  constexpr char kScores[] = "tokenizer.ggml.scores";
  if (gguf.Has(kScores)) {
    absl::StatusOr<std::vector<double>> scores = gguf.GetFloatArray(kScores);
    if (!scores.ok()) return KeyError(gguf, kScores, scores.status());
    spec.scores.assign(scores->begin(), scores->end());
  }
  constexpr char kTypes[] = "tokenizer.ggml.token_type";
  if (gguf.Has(kTypes)) {
    absl::StatusOr<std::vector<int64_t>> types = gguf.GetIntArray(kTypes);
    if (!types.ok()) return KeyError(gguf, kTypes, types.status());
    spec.token_types.reserve(types->size());
    for (int64_t t : *types) {
      // Out-of-range values are kept recognisably wrong for Create() to report.
      spec.token_types.push_back(t < 0 || t > 6 ? -1 : static_cast<int32_t>(t));
    }
  }
  constexpr char kMerges[] = "tokenizer.ggml.merges";
  if (gguf.Has(kMerges)) {
    absl::StatusOr<std::vector<std::string>> merges = gguf.GetStringArray(kMerges);
    if (!merges.ok()) return KeyError(gguf, kMerges, merges.status());
    spec.merges = *std::move(merges);
  }
  constexpr char kPre[] = "tokenizer.ggml.pre";
  if (gguf.Has(kPre)) {
    absl::StatusOr<std::string> pre = gguf.GetString(kPre);
    if (!pre.ok()) return KeyError(gguf, kPre, pre.status());
    spec.pre = *std::move(pre);
  }
  // Llama 3's tokenizer.json sets ignore_merges; llama.cpp ties it to the pre-tokenizer.
  spec.ignore_merges = spec.kind == TokenizerSpec::Kind::kByteLevelBpe &&
                       (spec.pre == "llama3" || spec.pre == "llama-bpe" || spec.pre == "llama-v3");

  RETURN_IF_ERROR(ReadTokenId(gguf, "tokenizer.ggml.bos_token_id", &spec.bos_id));
  RETURN_IF_ERROR(ReadTokenId(gguf, "tokenizer.ggml.eos_token_id", &spec.eos_id));
  RETURN_IF_ERROR(ReadTokenId(gguf, "tokenizer.ggml.unknown_token_id", &spec.unk_id));
  RETURN_IF_ERROR(ReadTokenId(gguf, "tokenizer.ggml.padding_token_id", &spec.pad_id));
  RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_bos_token", &spec.add_bos));
  RETURN_IF_ERROR(ReadBool(gguf, "tokenizer.ggml.add_space_prefix", &spec.add_space_prefix));
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    int32_t id = -1;
    RETURN_IF_ERROR(ReadTokenId(gguf, key, &id));
    AddEndOfGenerationId(&spec, id);
  }
  AddWellKnownEndOfGenerationIds(&spec);
  return spec;
}

}  // namespace riskkv
