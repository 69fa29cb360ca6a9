// Per-layer KV storage with f32/f16 conversion at the edges.
#include "common/model/kv_cache.h"

#include <sys/mman.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace riskkv {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int64_t n_layers, int64_t n_kv_heads,
                                                         int64_t head_dim, int64_t capacity,
                                                         DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype must be F32 or F16, got ", DTypeName(dtype)));
  }
  if (n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || capacity <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dimensions must be positive: layers=", n_layers,
                     " kv_heads=", n_kv_heads, " head_dim=", head_dim, " capacity=", capacity));
  }
  const int64_t elem = dtype == DType::kF16 ? 2 : 4;
  // Per-layer bytes, guarded against overflow before multiplying.
  if (n_kv_heads > (int64_t{1} << 20) || head_dim > (int64_t{1} << 20) ||
      capacity > (int64_t{1} << 38) / (n_kv_heads * head_dim * elem)) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", capacity, " tokens x ",
                                                     n_kv_heads, " heads x ", head_dim,
                                                     " is too large"));
  }
  auto cache = std::unique_ptr<KvCache>(new KvCache());
  cache->n_layers_ = n_layers;
  cache->n_kv_heads_ = n_kv_heads;
  cache->head_dim_ = head_dim;
  cache->capacity_ = capacity;
  cache->dtype_ = dtype;
  const size_t bytes = static_cast<size_t>(capacity * cache->token_bytes());
  for (int64_t l = 0; l < n_layers; ++l) {
    // Zero-filled, so an unwritten row never leaks old memory into a transfer.
    Buffer k = Map(bytes), v = Map(bytes);
    if (!k || !v) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a KV cache of ", capacity,
                                                       " tokens (",
                                                       2 * n_layers * bytes / (1 << 20), " MiB)"));
    }
    cache->k_.push_back(std::move(k));
    cache->v_.push_back(std::move(v));
  }
  return cache;
}

void KvCache::Unmap::operator()(uint8_t* p) const {
  if (p != nullptr) munmap(p, bytes);
}

KvCache::Buffer KvCache::Map(size_t bytes) {
  // Mapped rather than malloc'd: a freed cache goes back to the OS at once, where the heap would
  // keep the pages of every cache it ever held.
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Buffer(nullptr, Unmap{bytes});
  return Buffer(static_cast<uint8_t*>(p), Unmap{bytes});
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Clone() const {
  auto copy = Create(n_layers_, n_kv_heads_, head_dim_, capacity_, dtype_);
  if (!copy.ok()) return copy.status();
  if (auto s = (*copy)->CopyFrom(*this); !s.ok()) return s;
  return copy;
}

absl::Status KvCache::CopyFrom(const KvCache& other) {
  if (other.n_layers_ != n_layers_ || other.n_kv_heads_ != n_kv_heads_ ||
      other.head_dim_ != head_dim_ || other.capacity_ != capacity_ || other.dtype_ != dtype_) {
    return absl::InvalidArgumentError("KV cache copy between caches of different shapes");
  }
  const size_t bytes = static_cast<size_t>(other.n_tokens_ * token_bytes());
  for (int64_t l = 0; l < n_layers_; ++l) {
    std::memcpy(k_[l].get(), other.k_[l].get(), bytes);
    std::memcpy(v_[l].get(), other.v_[l].get(), bytes);
  }
  n_tokens_ = other.n_tokens_;
  return absl::OkStatus();
}

absl::Status KvCache::SetTokens(int64_t n) {
  if (n < 0 || n > capacity_) {
    return absl::OutOfRangeError(
        absl::StrCat("KV cache holds at most ", capacity_, " tokens, asked for ", n));
  }
  n_tokens_ = n;
  return absl::OkStatus();
}

KvView KvCache::KeyView(int64_t layer, int64_t extra) const {
  return {dtype_, k_[layer].get(), n_tokens_ + extra};
}

KvView KvCache::ValueView(int64_t layer, int64_t extra) const {
  return {dtype_, v_[layer].get(), n_tokens_ + extra};
}

absl::Status KvCache::CheckRange(int64_t layer, int64_t begin, int64_t count) const {
  if (layer < 0 || layer >= n_layers_) {
    return absl::OutOfRangeError(
        absl::StrCat("KV cache layer ", layer, " not in [0, ", n_layers_, ")"));
  }
  if (begin < 0 || count < 0 || begin + count > capacity_) {
    return absl::OutOfRangeError(absl::StrCat("KV cache rows [", begin, ", ", begin + count,
                                              ") exceed capacity ", capacity_));
  }
  return absl::OkStatus();
}

void KvCache::ToF32(DType dtype, const uint8_t* src, float* dst, int64_t n) {
  if (dtype == DType::kF16) {
    F16ToF32Row(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else {
    std::memcpy(dst, src, n * sizeof(float));
  }
}

void KvCache::FromF32(DType dtype, const float* src, uint8_t* dst, int64_t n) {
  if (dtype == DType::kF16) {
    F32ToF16Row(src, reinterpret_cast<uint16_t*>(dst), n);
  } else {
    std::memcpy(dst, src, n * sizeof(float));
  }
}

absl::Status KvCache::ReadKeys(int64_t layer, int64_t begin, int64_t count, float* out) const {
  if (auto s = CheckRange(layer, begin, count); !s.ok()) return s;
  ToF32(dtype_, KeyRows(layer, begin), out, count * width());
  return absl::OkStatus();
}

absl::Status KvCache::ReadValues(int64_t layer, int64_t begin, int64_t count, float* out) const {
  if (auto s = CheckRange(layer, begin, count); !s.ok()) return s;
  ToF32(dtype_, ValueRows(layer, begin), out, count * width());
  return absl::OkStatus();
}

absl::Status KvCache::WriteKeys(int64_t layer, int64_t begin, int64_t count, const float* in) {
  if (auto s = CheckRange(layer, begin, count); !s.ok()) return s;
  FromF32(dtype_, in, KeyRows(layer, begin), count * width());
  return absl::OkStatus();
}

absl::Status KvCache::WriteValues(int64_t layer, int64_t begin, int64_t count, const float* in) {
  if (auto s = CheckRange(layer, begin, count); !s.ok()) return s;
  FromF32(dtype_, in, ValueRows(layer, begin), count * width());
  return absl::OkStatus();
}

}  // namespace riskkv
