// PCRE2-backed pre-tokenizer stages.
#include "common/tokenizer/pre_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/text_util.h"

namespace riskkv::tokenizer_internal {
namespace {

// The patterns are those of the models' own tokenizer.json files.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Pattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// SmolLM's Digits(individual_digits=True) runs first: every numeric character on its own.
constexpr char kSingleDigitPattern[] = R"(\p{N})";

struct MatchDataDeleter {
  void operator()(pcre2_match_data* md) const { pcre2_match_data_free(md); }
};

}  // namespace

class PreTokenizer::Stage {
 public:
  static absl::StatusOr<std::unique_ptr<Stage>> Compile(const char* pattern) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InternalError(absl::StrCat("pre-tokenizer regex does not compile at offset ",
                                              error_offset, ": ",
                                              reinterpret_cast<const char*>(message)));
    }
    auto stage = std::unique_ptr<Stage>(new Stage(code));
    // JIT is only a speed-up; without it (unsupported CPU) the interpreter gives the same matches.
    stage->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return stage;
  }

  ~Stage() { pcre2_code_free(code_); }

  // Splits `text` into matches and the gaps between them, appending to *out.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* out) const {
    std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
        pcre2_match_data_create_from_pattern(code_, nullptr));
    if (md == nullptr) return absl::ResourceExhaustedError("pcre2 match data allocation failed");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const size_t n = text.size();
    size_t last = 0;  // end of the text already handed out
    size_t pos = 0;   // where the next search starts
    while (pos < n) {
      // The whole text was validated once; letting PCRE2 re-check it on every call would make
      // splitting quadratic in the text length.
      int rc = pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
      if (jit_ && (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_NOMEMORY)) {
        rc = pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md.get(),
                         nullptr);
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        return absl::InternalError(absl::StrCat("pre-tokenizer regex failed at offset ", pos, ": ",
                                                reinterpret_cast<const char*>(message)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
      const size_t start = ov[0];
      const size_t end = ov[1];
      if (start < pos || end < start || end > n) {
        return absl::InternalError("pre-tokenizer regex returned an inconsistent match");
      }
      if (end == start) {
        // An empty match yields no piece; step over one character so the search progresses.
        pos = start + Utf8SequenceLength(static_cast<unsigned char>(text[start]));
        continue;
      }
      if (start > last) out->push_back(text.substr(last, start - last));
      out->push_back(text.substr(start, end - start));
      last = pos = end;
    }
    if (last < n) out->push_back(text.substr(last));
    return absl::OkStatus();
  }

 private:
  explicit Stage(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
  bool jit_ = false;
};

PreTokenizer::~PreTokenizer() = default;

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(std::string_view name) {
  std::vector<const char*> patterns;
  if (name == "gpt2" || name == "gpt-2" || name == "default") {
    patterns = {kGpt2Pattern};
  } else if (name == "smollm") {
    patterns = {kSingleDigitPattern, kGpt2Pattern};
  } else if (name == "qwen2") {
    patterns = {kQwen2Pattern};
  } else if (name == "llama3" || name == "llama-bpe" || name == "llama-v3") {
    patterns = {kLlama3Pattern};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported pre-tokenizer '", AbslView(name),
                     "' (supported: gpt2, default, smollm, qwen2, llama3)"));
  }
  auto pre = std::unique_ptr<PreTokenizer>(new PreTokenizer());
  for (const char* pattern : patterns) {
    auto stage = Stage::Compile(pattern);
    if (!stage.ok()) return stage.status();
    pre->stages_.push_back(*std::move(stage));
  }
  return pre;
}

std::string_view PreTokenizerNameForPattern(std::string_view pattern) {
  if (pattern == kGpt2Pattern) return "gpt2";
  if (pattern == kQwen2Pattern) return "qwen2";
  if (pattern == kLlama3Pattern) return "llama3";
  return "";
}

absl::Status PreTokenizer::Split(std::string_view text,
                                 std::vector<std::string_view>* pieces) const {
  std::vector<std::string_view> current{text};
  std::vector<std::string_view> next;
  for (const auto& stage : stages_) {
    next.clear();
    for (std::string_view piece : current) {
      absl::Status status = stage->Split(piece, &next);
      if (!status.ok()) return status;
    }
    current.swap(next);
  }
  pieces->insert(pieces->end(), current.begin(), current.end());
  return absl::OkStatus();
}

}  // namespace riskkv::tokenizer_internal
