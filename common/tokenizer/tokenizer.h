// Text <-> token ids for Llama-family models: byte-level BPE (GPT-2 style, as in SmolLM2 and
// Qwen2, from GGUF metadata or a Hugging Face tokenizer.json) and SentencePiece-style BPE with
// scores and byte fallback (the GGUF "llama" tokenizer of TinyLlama / Llama 2).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/normalizer.h"

namespace riskkv {

class GgufFile;

// Everything a tokenizer needs, independent of where it was read from.
struct TokenizerSpec {
  enum class Kind { kByteLevelBpe, kSentencePiece };
  Kind kind = Kind::kByteLevelBpe;
  std::vector<std::string> tokens;  // id -> token text (byte-level: GPT-2 byte-to-unicode form)
  std::vector<float> scores;        // SentencePiece merge priorities (empty for byte-level BPE)
  // GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
  std::vector<int32_t> token_types;  // empty means all normal
  std::vector<std::string> merges;   // byte-level BPE merges "left right", highest priority first
  // Pre-tokenizer: "gpt2" (default), "smollm", "qwen2", "llama3" or "default"; SentencePiece
  // ignores it. llama.cpp's aliases "gpt-2" and "llama-bpe" are accepted too.
  std::string pre = "gpt2";
  // Byte-level BPE: a pre-token that is itself in the vocabulary is emitted whole, without
  // merging (HF "ignore_merges", set by Llama 3).
  bool ignore_merges = false;
  // Byte-level BPE: the normal form each piece of text between added tokens is put in before
  // pre-tokenization (HF's rule for added tokens with normalized=false, the only kind Qwen2 has).
  Normalization normalization = Normalization::kNone;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;           // prepend BOS when Encode(..., add_special=true)
  bool add_space_prefix = false;  // SentencePiece: prepend "▁" to the text
  std::vector<int32_t> eog_ids;   // end-of-generation ids besides eos (e.g. <|im_end|>)
};

// Immutable once created: Encode, Decode and TokenBytes may run concurrently.
class Tokenizer {
 public:
  // Validates the spec (ids in range, merges refer to existing tokens, ...).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  // Reads tokenizer.ggml.* metadata ("gpt2" and "llama" models; any other model is an
  // InvalidArgument naming it, a file without tokenizer.ggml.model NotFound). Keys a file lacks
  // get llama.cpp's defaults. Values are checked by Create(), not here.
  static absl::StatusOr<TokenizerSpec> SpecFromGguf(const GgufFile& gguf);
  // Reads a Hugging Face tokenizer.json with a BPE model and ByteLevel pre-tokenizer/decoder.
  // bos/eos/pad and add_bos come from a tokenizer_config.json beside it when there is one,
  // otherwise from the post-processor template and well-known special token names.
  static absl::StatusOr<TokenizerSpec> SpecFromTokenizerJson(const std::string& path);

  virtual ~Tokenizer() = default;

  // Encodes UTF-8 text. add_special prepends BOS when the spec says so; parse_special makes
  // control tokens written literally in the text (e.g. "<|im_start|>") map to their ids instead
  // of being split into pieces. User-defined tokens (HF non-special added tokens) are always
  // matched, as Hugging Face and llama.cpp do. Invalid UTF-8 is an InvalidArgument error.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special,
                                                      bool parse_special) const = 0;
  // Concatenated text of the ids; control and unknown tokens decode to "" unless
  // render_special. SentencePiece drops the space that add_space_prefix put before the first
  // piece. Out-of-range ids are an InvalidArgument error.
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                             bool render_special = false) const = 0;
  // Raw bytes of one token as it appears in decoded text (may be a partial UTF-8 sequence);
  // control tokens give their text, out-of-range ids "". A SentencePiece piece keeps its
  // leading space even where Decode would drop it as the add_space_prefix space.
  virtual std::string TokenBytes(int32_t id) const = 0;

  const TokenizerSpec& spec() const { return spec_; }
  int32_t vocab_size() const { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const { return spec_.bos_id; }
  int32_t eos_id() const { return spec_.eos_id; }
  // True for EOS and the other end-of-generation ids.
  bool IsEndOfGeneration(int32_t id) const;

 protected:
  explicit Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {}
  TokenizerSpec spec_;
};

// OK when `text` is well-formed UTF-8 (the check Encode applies); otherwise InvalidArgument
// naming the offset of the first bad byte.
absl::Status ValidateUtf8(std::string_view text);

}  // namespace riskkv
