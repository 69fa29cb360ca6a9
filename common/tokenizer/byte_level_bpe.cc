// Byte-level BPE: rank-ordered merging with a priority queue over a linked list of symbols.
#include "common/tokenizer/byte_level_bpe.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/special_tokens.h"
#include "common/tokenizer/text_util.h"

namespace riskkv::tokenizer_internal {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Bytes a vocabulary entry stands for: each GPT-2 character back to its byte. Characters
// outside the 256 (possible in hand-made vocabularies) are kept as their UTF-8.
std::string ByteLevelToBytes(std::string_view token) {
  std::string out;
  size_t pos = 0;
  while (pos < token.size()) {
    const size_t start = pos;
    const uint32_t cp = NextCodePoint(token, &pos);
    const int b = UnicodeToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(token.substr(start, pos - start));
    }
  }
  return out;
}

class ByteLevelBpe final : public Tokenizer {
 public:
  explicit ByteLevelBpe(TokenizerSpec spec) : Tokenizer(std::move(spec)), specials_(spec_) {}

  absl::Status Init() {
    auto pre = PreTokenizer::Create(spec_.pre);
    if (!pre.ok()) return pre.status();
    pre_ = *std::move(pre);

    const int32_t n = vocab_size();
    token_to_id_.reserve(n);
    token_bytes_.resize(n);
    for (int32_t id = 0; id < n; ++id) {
      // Later duplicates win, as in llama.cpp's vocabulary loading.
      token_to_id_[spec_.tokens[id]] = id;
      const int32_t type = TokenTypeOf(spec_, id);
      const bool raw = type == kTypeControl || type == kTypeUserDefined || type == kTypeUnknown;
      token_bytes_[id] = raw ? spec_.tokens[id] : ByteLevelToBytes(spec_.tokens[id]);
    }
    const auto& byte_chars = ByteToUnicode();
    for (int b = 0; b < 256; ++b) {
      auto it = token_to_id_.find(byte_chars[b]);
      byte_ids_[b] = it == token_to_id_.end() ? -1 : it->second;
    }

    merges_.reserve(spec_.merges.size());
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
      const std::string& merge = spec_.merges[rank];
      // The separator is the first space after the first character: byte-level tokens never
      // contain a space, but a leading one would be a malformed left side anyway.
      const size_t space = merge.size() > 1 ? merge.find(' ', 1) : std::string::npos;
      if (space == std::string::npos || space + 1 >= merge.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("merge ", rank, " '", merge, "' is not of the form 'left right'"));
      }
      const std::string left = merge.substr(0, space);
      const std::string right = merge.substr(space + 1);
      auto l = token_to_id_.find(left);
      auto r = token_to_id_.find(right);
      auto m = token_to_id_.find(left + right);
      if (l == token_to_id_.end() || r == token_to_id_.end() || m == token_to_id_.end()) {
        const std::string& missing = l == token_to_id_.end()   ? left
                                     : r == token_to_id_.end() ? right
                                                               : left + right;
        return absl::InvalidArgumentError(absl::StrCat("merge ", rank, " '", merge, "': token '",
                                                       missing, "' is not in the vocabulary"));
      }
      // The first (highest-priority) occurrence of a pair wins.
      merges_.try_emplace(PairKey(l->second, r->second),
                          Merge{static_cast<int32_t>(rank), m->second});
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special,
                                              bool parse_special) const override {
    if (absl::Status s = ValidateUtf8(text); !s.ok()) return s;
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 2);
    if (add_special && spec_.add_bos && spec_.bos_id >= 0) ids.push_back(spec_.bos_id);
    Scratch scratch;
    std::vector<std::string_view> words;
    std::string normalized;
    for (const TextFragment& fragment : specials_.Split(text, parse_special)) {
      if (fragment.id >= 0) {
        ids.push_back(fragment.id);
        continue;
      }
      words.clear();
      std::string_view piece = fragment.text;
      if (spec_.normalization != Normalization::kNone) {
        absl::StatusOr<std::string> normal = Normalize(spec_.normalization, piece);
        if (!normal.ok()) return normal.status();
        normalized = *std::move(normal);
        piece = normalized;
      }
      if (absl::Status s = pre_->Split(piece, &words); !s.ok()) return s;
      for (std::string_view word : words) {
        if (absl::Status s = EncodeWord(word, &scratch, &ids); !s.ok()) return s;
      }
    }
    return ids;
  }

  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     bool render_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " out of range [0, ", vocab_size(), ")"));
      }
      const int32_t type = TokenTypeOf(spec_, id);
      if ((type == kTypeControl || type == kTypeUnknown) && !render_special) continue;
      out += token_bytes_[id];
    }
    return out;
  }

  std::string TokenBytes(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? token_bytes_[id] : std::string();
  }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  // One symbol of the word being merged; erased symbols keep their slot with id kErased.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  // A possible merge of symbol `left` with its right neighbour, valid while both still hold
  // the ids it was made from.
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
    // Lowest rank first, then leftmost, the order HF tokenizers and llama.cpp merge in.
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  struct Scratch {
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
    std::string unicode_word;
  };
  static constexpr int32_t kErased = -2;

  void PushCandidate(const std::vector<Symbol>& symbols, int32_t left,
                     std::vector<Candidate>* heap) const {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    const int32_t a = symbols[left].id;
    const int32_t b = symbols[right].id;
    if (a < 0 || b < 0) return;
    auto it = merges_.find(PairKey(a, b));
    if (it == merges_.end()) return;
    heap->push_back({it->second.rank, left, a, b, it->second.result});
    std::push_heap(heap->begin(), heap->end(), std::greater<>());
  }

  absl::Status EncodeWord(std::string_view word, Scratch* scratch,
                          std::vector<int32_t>* ids) const {
    if (word.empty()) return absl::OkStatus();
    if (spec_.ignore_merges) {
      std::string& u = scratch->unicode_word;
      u.clear();
      for (unsigned char c : word) u += ByteToUnicode()[c];
      if (auto it = token_to_id_.find(u); it != token_to_id_.end()) {
        ids->push_back(it->second);
        return absl::OkStatus();
      }
    }
    std::vector<Symbol>& symbols = scratch->symbols;
    std::vector<Candidate>& heap = scratch->heap;
    symbols.clear();
    heap.clear();
    const int32_t n = static_cast<int32_t>(word.size());
    for (int32_t i = 0; i < n; ++i) {
      symbols.push_back(
          {byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : -1});
    }
    for (int32_t i = 0; i + 1 < n; ++i) PushCandidate(symbols, i, &heap);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Candidate c = heap.back();
      heap.pop_back();
      Symbol& left = symbols[c.left];
      if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
      Symbol& right = symbols[left.next];
      left.id = c.result;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = c.left;
      right.id = kErased;
      PushCandidate(symbols, left.prev, &heap);
      PushCandidate(symbols, c.left, &heap);
    }
    for (int32_t i = 0; i >= 0; i = symbols[i].next) {
      int32_t id = symbols[i].id;
      if (id < 0) {
        // A byte with no token of its own: the vocabulary is not a full byte-level one.
        if (spec_.unk_id < 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "byte 0x", absl::Hex(static_cast<unsigned char>(word[i]), absl::kZeroPad2),
              " has no token and the vocabulary has no unknown token"));
        }
        id = spec_.unk_id;
      }
      ids->push_back(id);
    }
    return absl::OkStatus();
  }

  SpecialTokenMatcher specials_;
  std::unique_ptr<PreTokenizer> pre_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};
  std::vector<std::string> token_bytes_;  // id -> decoded bytes
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> CreateByteLevelBpe(TokenizerSpec spec) {
  auto tokenizer = std::make_unique<ByteLevelBpe>(std::move(spec));
  if (absl::Status s = tokenizer->Init(); !s.ok()) return s;
  return tokenizer;
}

}  // namespace riskkv::tokenizer_internal
