// SentencePiece BPE encoding as llama.cpp does it: bigram merging by score with a priority
// queue over a linked list of pieces.
#include "common/tokenizer/sentencepiece_bpe.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/text_util.h"

namespace riskkv::tokenizer_internal {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// Byte value of a "<0xXX>" piece, or -1.
int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || !piece.starts_with("<0x") || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// The piece's text with each U+2581 back to a space.
std::string UnescapeSpaces(std::string_view piece) {
  std::string out;
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos).starts_with(kSpaceMark)) {
      out.push_back(' ');
      pos += kSpaceMark.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

class SentencePieceBpe final : public Tokenizer {
 public:
  explicit SentencePieceBpe(TokenizerSpec spec) : Tokenizer(std::move(spec)), specials_(spec_) {}

  absl::Status Init() {
    const int32_t n = vocab_size();
    if (spec_.scores.size() != static_cast<size_t>(n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("SentencePiece tokenizer needs one score per "
                       "token: ",
                       spec_.scores.size(), " scores for ", n, " tokens"));
    }
    byte_ids_.fill(-1);
    token_bytes_.resize(n);
    for (int32_t id = 0; id < n; ++id) {
      const std::string& piece = spec_.tokens[id];
      if (!std::isfinite(spec_.scores[id])) {
        return absl::InvalidArgumentError(absl::StrCat("score of token ", id, " is not finite"));
      }
      const int32_t type = TokenTypeOf(spec_, id);
      if (type == kTypeByte) {
        const int b = ParseBytePiece(piece);
        if (b < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("byte token ", id, " '", piece, "' is not of the form <0xXX>"));
        }
        if (byte_ids_[b] < 0) byte_ids_[b] = id;
        token_bytes_[id] = std::string(1, static_cast<char>(b));
        continue;
      }
      if (type == kTypeControl || type == kTypeUnknown) {
        token_bytes_[id] = piece;
        continue;
      }
      // Only ordinary pieces come out of merging: control, unknown and byte tokens are never
      // spelled by the text itself, as in sentencepiece.
      piece_to_id_[piece] = id;
      token_bytes_[id] = UnescapeSpaces(piece);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special,
                                              bool parse_special) const override {
    if (absl::Status s = ValidateUtf8(text); !s.ok()) return s;
    std::vector<int32_t> ids;
    if (add_special && spec_.add_bos && spec_.bos_id >= 0) ids.push_back(spec_.bos_id);
    // Every text run at the start or right after a special token gets the prefix space, as
    // llama.cpp does (and HF's slow Llama tokenizer, which encodes each run separately).
    bool after_special = true;
    std::string escaped;
    for (const TextFragment& fragment : specials_.Split(text, parse_special)) {
      if (fragment.id >= 0) {
        ids.push_back(fragment.id);
        after_special = true;
        continue;
      }
      escaped.clear();
      if (spec_.add_space_prefix && after_special) escaped += kSpaceMark;
      for (char c : fragment.text) {
        if (c == ' ') {
          escaped += kSpaceMark;
        } else {
          escaped += c;
        }
      }
      if (absl::Status s = EncodeRun(escaped, &ids); !s.ok()) return s;
      after_special = false;
    }
    return ids;
  }

  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool render_special) const override {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " out of range [0, ", vocab_size(), ")"));
      }
      const int32_t type = TokenTypeOf(spec_, id);
      if ((type == kTypeControl || type == kTypeUnknown) && !render_special) continue;
      std::string_view piece = token_bytes_[id];
      // The first piece's leading space is the one add_space_prefix put there.
      if (first && spec_.add_space_prefix && type != kTypeByte && type != kTypeControl &&
          type != kTypeUnknown && piece.starts_with(' ')) {
        piece.remove_prefix(1);
      }
      first = false;
      out += piece;
    }
    return out;
  }

  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? token_bytes_[id] : std::string();
  }

 private:
  // A piece of the run being merged: bytes [start, start + len) of it; len 0 once merged away.
  struct Symbol {
    int32_t start;
    int32_t len;
    int32_t prev;
    int32_t next;
  };
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    int32_t len;  // combined length when queued; a mismatch means a side changed since
    // Highest score first, then leftmost (sentencepiece's and llama.cpp's order).
    bool operator<(const Bigram& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };

  int32_t LookupPiece(std::string_view piece) const {
    auto it = piece_to_id_.find(AbslView(piece));
    return it == piece_to_id_.end() ? -1 : it->second;
  }

  void PushBigram(std::string_view run, const std::vector<Symbol>& symbols, int32_t left,
                  std::vector<Bigram>* heap) const {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[l.next];
    const int32_t id = LookupPiece(run.substr(l.start, l.len + r.len));
    if (id < 0) return;
    heap->push_back({spec_.scores[id], left, l.next, l.len + r.len});
    std::push_heap(heap->begin(), heap->end());
  }

  absl::Status EncodeRun(std::string_view run, std::vector<int32_t>* ids) const {
    std::vector<Symbol> symbols;
    for (size_t pos = 0; pos < run.size();) {
      const int32_t len =
          std::min<int32_t>(Utf8SequenceLength(static_cast<unsigned char>(run[pos])),
                            static_cast<int32_t>(run.size() - pos));
      const int32_t index = static_cast<int32_t>(symbols.size());
      symbols.push_back({static_cast<int32_t>(pos), len, index - 1, -1});
      if (index > 0) symbols[index - 1].next = index;
      pos += len;
    }
    std::vector<Bigram> heap;
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) {
      PushBigram(run, symbols, i, &heap);
    }
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const Bigram b = heap.back();
      heap.pop_back();
      Symbol& left = symbols[b.left];
      Symbol& right = symbols[b.right];
      if (left.len == 0 || right.len == 0 || left.next != b.right ||
          left.len + right.len != b.len) {
        continue;
      }
      left.len += right.len;
      right.len = 0;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = b.left;
      PushBigram(run, symbols, left.prev, &heap);
      PushBigram(run, symbols, b.left, &heap);
    }
    for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
      const std::string_view piece = run.substr(symbols[i].start, symbols[i].len);
      if (const int32_t id = LookupPiece(piece); id >= 0) {
        ids->push_back(id);
        continue;
      }
      // No piece for this character: spell it in byte tokens if the vocabulary has them all.
      const bool all_bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_ids_[static_cast<unsigned char>(c)] >= 0;
      });
      if (all_bytes) {
        for (char c : piece) ids->push_back(byte_ids_[static_cast<unsigned char>(c)]);
      } else if (spec_.unk_id >= 0) {
        ids->push_back(spec_.unk_id);
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "'", AbslView(piece),
            "' has no piece, no byte fallback and the vocabulary has no unknown token"));
      }
    }
    return absl::OkStatus();
  }

  SpecialTokenMatcher specials_;
  absl::flat_hash_map<std::string, int32_t> piece_to_id_;  // mergeable pieces only
  std::array<int32_t, 256> byte_ids_{};                    // <0xXX> tokens, -1 when absent
  std::vector<std::string> token_bytes_;                   // id -> decoded bytes
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateSentencePiece(TokenizerSpec spec) {
  auto tokenizer = std::make_unique<SentencePieceBpe>(std::move(spec));
  if (absl::Status s = tokenizer->Init(); !s.ok()) return s;
  return tokenizer;
}

}  // namespace riskkv::tokenizer_internal
