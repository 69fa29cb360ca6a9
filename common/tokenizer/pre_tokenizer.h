// Regex pre-tokenizers of byte-level BPE (GPT-2, SmolLM, Qwen2, Llama 3), on PCRE2 in UTF+UCP
// mode so \p{L}, \p{N} and \s follow Unicode properties like the reference implementations.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace riskkv::tokenizer_internal {

class PreTokenizer {
 public:
  // `name` is TokenizerSpec::pre; unknown names are InvalidArgument.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(std::string_view name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pre-tokens of `text` (valid UTF-8, already checked) to *pieces. The pieces are
  // views into `text` and concatenate back to it. Each stage splits every piece of the previous
  // one into its matches and the text between them (HF's "isolated" behaviour), so a lookahead
  // never sees past a piece, as in Hugging Face tokenizers.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  class Stage;
  PreTokenizer() = default;
  std::vector<std::unique_ptr<Stage>> stages_;
};

// The pre-tokenizer name whose single regex stage is `pattern` (as written in a tokenizer.json
// Split pre-tokenizer): "gpt2", "qwen2" or "llama3"; "" when the pattern is not one of them.
std::string_view PreTokenizerNameForPattern(std::string_view pattern);

}  // namespace riskkv::tokenizer_internal
