// The migration stream's shared rules (see wire.h).
#include "services/migration/wire.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/kvcodec/transform_codec.h"
#include "common/recovery/retention_policy.h"

namespace riskkv {

std::vector<int32_t> SendOrder(MigrationMode mode, int64_t n_layers,
                               const RetentionPolicy* policy) {
  std::vector<int32_t> order;
  if (mode == MigrationMode::kTokenReplay) return order;
  if (mode == MigrationMode::kFullKv || policy == nullptr) {
    for (int32_t l = 0; l < n_layers; ++l) order.push_back(l);
    return order;
  }
  std::set<int32_t> sent;
  for (const LayerGroup& g : policy->rebuilt_groups) {
    for (int32_t a : g.anchors) {
      if (sent.insert(a).second) order.push_back(a);
    }
  }
  for (int32_t l : policy->kept_layers) {
    if (sent.insert(l).second) order.push_back(l);
  }
  return order;
}

int64_t ChunkRowUnit(WireForm form) {
  return form == WireForm::kPlain || form == WireForm::kTransform ? 1 : kTokenGroup;
}

namespace {

// The transform form's bound on a chunk of n rows, wherever it starts.
int64_t TransformBound(int64_t n, int64_t width) {
  return std::max(TransformChunkBound(width, 0, n), TransformChunkBound(width, kSinkTokens, n));
}

}  // namespace

int64_t MinChunkBytes(WireForm form, int64_t kv_heads, int64_t head_dim, DType dtype) {
  if (form == WireForm::kTransform) return TransformBound(1, kv_heads * head_dim);
  const int64_t unit = ChunkRowUnit(form);
  return std::max(EncodedBytes(form, false, 0, unit, kv_heads, head_dim, dtype),
                  EncodedBytes(form, true, 0, unit, kv_heads, head_dim, dtype));
}

int64_t RowsPerChunk(int64_t max_chunk_bytes, WireForm form, int64_t kv_heads, int64_t head_dim,
                     DType dtype) {
  if (form == WireForm::kTransform) {
    // The most rows whose bound fits (the bound grows with the rows; at least one row).
    const int64_t width = kv_heads * head_dim;
    int64_t lo = 1, hi = std::max<int64_t>(1, max_chunk_bytes / (2 * width) + 1);
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (TransformBound(mid, width) <= max_chunk_bytes) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  const int64_t unit_bytes = MinChunkBytes(form, kv_heads, head_dim, dtype);
  return ChunkRowUnit(form) * std::max<int64_t>(1, max_chunk_bytes / unit_bytes);
}

int64_t StreamKvBytes(WireForm form, int64_t history, int64_t layers, int64_t kv_heads,
                      int64_t head_dim, DType dtype) {
  return layers * LayerWireBytes(form, history, kv_heads, head_dim, dtype);
}

int64_t EstimateKvBytes(WireForm form, const RetentionPolicy* policy, int64_t history,
                        int64_t layers, const ModelConfig& config, DType dtype) {
  if (form != WireForm::kTransform) {
    return StreamKvBytes(form, history, layers, config.n_kv_heads, config.head_dim, dtype);
  }
  if (policy == nullptr) return 0;
  return static_cast<int64_t>(
      std::llround(policy->transform_bytes_per_token * static_cast<double>(history * layers)));
}

absl::Status CheckTransforms(const PredictorBank* bank, const ModelConfig& config) {
  if (bank == nullptr || bank->transforms() == nullptr) {
    return absl::FailedPreconditionError(
        bank == nullptr ? "the transform form needs the policy's predictor bank, and none is loaded"
                        : "predictor bank " + bank->content_hash() + " holds no transforms");
  }
  const BankTransforms& t = *bank->transforms();
  const LayerTransform& first = t.layers.front()[0];
  if (static_cast<int64_t>(t.layers.size()) != config.n_layers ||
      first.heads != config.n_kv_heads || first.dim != config.head_dim) {
    return absl::FailedPreconditionError(absl::StrCat(
        "predictor bank ", bank->content_hash(), " holds transforms of ", t.layers.size(),
        " layers of ", first.heads, " heads of ", first.dim, ", not this model's ", config.n_layers,
        " layers of ", config.n_kv_heads, " KV heads of ", config.head_dim));
  }
  return absl::OkStatus();
}

uint32_t ExtendWithCrc(uint32_t acc, uint32_t crc) {
  uint8_t le[4] = {static_cast<uint8_t>(crc), static_cast<uint8_t>(crc >> 8),
                   static_cast<uint8_t>(crc >> 16), static_cast<uint8_t>(crc >> 24)};
  return Crc32cExtend(acc, le);
}

v1::KvDtype DtypeToProto(DType dtype) { return dtype == DType::kF16 ? v1::KV_F16 : v1::KV_F32; }

absl::StatusOr<DType> DtypeFromProto(v1::KvDtype d) {
  switch (d) {
    case v1::KV_F32:
      return DType::kF32;
    case v1::KV_F16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kv_dtype ", static_cast<int>(d), " is not KV_F32 or KV_F16"));
  }
}

v1::KvWireForm WireFormToProto(WireForm form) {
  switch (form) {
    case WireForm::kInt8:
      return v1::KV_WIRE_INT8;
    case WireForm::kInt4:
      return v1::KV_WIRE_INT4;
    case WireForm::kTransform:
      return v1::KV_WIRE_TRANSFORM;
    case WireForm::kPlain:
      break;
  }
  return v1::KV_WIRE_PLAIN;
}

absl::StatusOr<WireForm> WireFormFromProto(v1::KvWireForm form) {
  switch (form) {
    case v1::KV_WIRE_FORM_UNSPECIFIED:
    case v1::KV_WIRE_PLAIN:
      return WireForm::kPlain;
    case v1::KV_WIRE_INT8:
      return WireForm::kInt8;
    case v1::KV_WIRE_INT4:
      return WireForm::kInt4;
    case v1::KV_WIRE_TRANSFORM:
      return WireForm::kTransform;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("wire form ", static_cast<int>(form),
                       " is not one this node decodes (plain, int8, int4, transform)"));
  }
}

absl::Status CheckMigrationId(const std::string& id, bool required) {
  if ((required && id.empty()) || id.size() > 64 ||
      id.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("migration_id must be ", required ? "1 to" : "at most",
                     " 64 lowercase hex digits, not '", id.substr(0, 80), "'"));
  }
  return absl::OkStatus();
}

}  // namespace riskkv
