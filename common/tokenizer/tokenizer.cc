// Spec validation shared by both tokenizer kinds, and the factory that picks one.
#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/byte_level_bpe.h"
#include "common/tokenizer/sentencepiece_bpe.h"

namespace riskkv {
namespace {

absl::Status CheckId(const char* what, int32_t id, size_t n) {
  if (id == -1 || (id >= 0 && static_cast<size_t>(id) < n)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " ", id, " out of range [0, ", n, ") (use -1 for none)"));
}

absl::Status ValidateCommon(const TokenizerSpec& spec) {
  const size_t n = spec.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer spec has no tokens");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("vocabulary of ", n, " tokens is too large"));
  }
  if (!spec.token_types.empty() && spec.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.token_types.size(), " token types for ", n, " tokens"));
  }
  for (size_t i = 0; i < spec.token_types.size(); ++i) {
    if (spec.token_types[i] < 0 || spec.token_types[i] > 6) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i, " has unknown token type ", spec.token_types[i]));
    }
  }
  if (!spec.scores.empty() && spec.scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.scores.size(), " scores for ", n, " tokens"));
  }
  if (absl::Status s = CheckId("bos_id", spec.bos_id, n); !s.ok()) return s;
  if (absl::Status s = CheckId("eos_id", spec.eos_id, n); !s.ok()) return s;
  if (absl::Status s = CheckId("unk_id", spec.unk_id, n); !s.ok()) return s;
  if (absl::Status s = CheckId("pad_id", spec.pad_id, n); !s.ok()) return s;
  for (int32_t id : spec.eog_ids) {
    if (id < 0 || static_cast<size_t>(id) >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("end-of-generation id ", id, " out of range [0, ", n, ")"));
    }
  }
  if (spec.add_bos && spec.bos_id < 0) {
    return absl::InvalidArgumentError("add_bos is set but the spec has no bos_id");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  if (absl::Status s = ValidateCommon(spec); !s.ok()) return s;
  switch (spec.kind) {
    case TokenizerSpec::Kind::kByteLevelBpe:
      return tokenizer_internal::CreateByteLevelBpe(std::move(spec));
    case TokenizerSpec::Kind::kSentencePiece:
      return tokenizer_internal::CreateSentencePiece(std::move(spec));
  }
  return absl::InvalidArgumentError("unknown tokenizer kind");
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  if (id < 0) return false;
  return id == spec_.eos_id ||
         std::find(spec_.eog_ids.begin(), spec_.eog_ids.end(), id) != spec_.eog_ids.end();
}

}  // namespace riskkv
