// Per-layer key/value cache of one decoding session.
//
// Layout: for every layer, K and V are each a dense array [capacity, n_kv_heads, head_dim],
// row-major, in the cache's storage dtype (F32 or F16). Row t holds the token at position t;
// keys are stored AFTER RoPE, in the model's own RoPE layout. Positions [0, n_tokens()) are
// valid in every layer. Layers are separate allocations so a layer can be dropped, sent or
// rebuilt on its own.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace riskkv {

class KvCache {
 public:
  // dtype must be kF32 or kF16. Each layer's K and V are anonymous memory mappings: zeroed
  // lazily by the OS (untouched pages cost nothing) and returned to it when the cache is
  // destroyed. A cache that cannot be allocated is ResourceExhausted.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int64_t n_layers, int64_t n_kv_heads,
                                                         int64_t head_dim, int64_t capacity,
                                                         DType dtype);

  int64_t n_layers() const { return n_layers_; }
  int64_t n_kv_heads() const { return n_kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  int64_t capacity() const { return capacity_; }
  DType dtype() const { return dtype_; }
  // Values per token per layer (n_kv_heads * head_dim).
  int64_t width() const { return n_kv_heads_ * head_dim_; }
  // Bytes of one token's K (or V) in one layer.
  int64_t token_bytes() const { return width() * (dtype_ == DType::kF16 ? 2 : 4); }

  // A deep copy (same shape, dtype, contents and token count).
  absl::StatusOr<std::unique_ptr<KvCache>> Clone() const;
  // Copies the contents and token count of a cache of the same shape and dtype.
  absl::Status CopyFrom(const KvCache& other);

  // Number of valid positions.
  int64_t n_tokens() const { return n_tokens_; }
  // Marks positions [0, n) valid (n <= capacity). Shrinking discards the tail.
  absl::Status SetTokens(int64_t n);

  // Views for attention over the valid positions plus `extra` positions being written.
  KvView KeyView(int64_t layer, int64_t extra = 0) const;
  KvView ValueView(int64_t layer, int64_t extra = 0) const;

  // Raw storage of a layer's K or V rows [begin, begin + count).
  uint8_t* KeyRows(int64_t layer, int64_t begin) { return k_[layer].get() + begin * token_bytes(); }
  uint8_t* ValueRows(int64_t layer, int64_t begin) {
    return v_[layer].get() + begin * token_bytes();
  }
  const uint8_t* KeyRows(int64_t layer, int64_t begin) const {
    return k_[layer].get() + begin * token_bytes();
  }
  const uint8_t* ValueRows(int64_t layer, int64_t begin) const {
    return v_[layer].get() + begin * token_bytes();
  }

  // Copies rows [begin, begin + count) of a layer to/from f32 [count, n_kv_heads, head_dim],
  // converting from/to the storage dtype. Ranges must lie within the capacity.
  absl::Status ReadKeys(int64_t layer, int64_t begin, int64_t count, float* out) const;
  absl::Status ReadValues(int64_t layer, int64_t begin, int64_t count, float* out) const;
  absl::Status WriteKeys(int64_t layer, int64_t begin, int64_t count, const float* in);
  absl::Status WriteValues(int64_t layer, int64_t begin, int64_t count, const float* in);

  // Bytes held by K and V of all layers at full capacity.
  int64_t allocated_bytes() const { return 2 * n_layers_ * capacity_ * token_bytes(); }

 private:
  KvCache() = default;
  absl::Status CheckRange(int64_t layer, int64_t begin, int64_t count) const;
  static void ToF32(DType dtype, const uint8_t* src, float* dst, int64_t n);
  static void FromF32(DType dtype, const float* src, uint8_t* dst, int64_t n);

  struct Unmap {
    size_t bytes = 0;
    void operator()(uint8_t* p) const;
  };
  using Buffer = std::unique_ptr<uint8_t, Unmap>;
  // `bytes` of zeroed memory from the OS; null when it has none.
  static Buffer Map(size_t bytes);

  int64_t n_layers_ = 0, n_kv_heads_ = 0, head_dim_ = 0, capacity_ = 0, n_tokens_ = 0;
  DType dtype_ = DType::kF32;
  std::vector<Buffer> k_, v_;
};

}  // namespace riskkv
