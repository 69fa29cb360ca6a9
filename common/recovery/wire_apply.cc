#include "common/recovery/wire_apply.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvcodec/kv_codec.h"
#include "common/kvcodec/transform_codec.h"

namespace riskkv {

absl::Status ApplyWireForm(WireForm form, std::span<const int32_t> layers, int64_t rows,
                           KvCache& cache, const WireTransforms* transforms, int64_t* bytes) {
  if (rows < 0 || rows > cache.n_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows, " rows asked of a cache holding ", cache.n_tokens()));
  }
  if (bytes != nullptr) *bytes = 0;
  for (int32_t layer : layers) {
    if (layer < 0 || layer >= cache.n_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " is outside the cache's ", cache.n_layers()));
    }
  }
  const bool transform = form == WireForm::kTransform;
  if (transform) {
    const BankTransforms* t = transforms ? transforms->transforms : nullptr;
    if (t == nullptr || static_cast<int64_t>(t->layers.size()) != cache.n_layers() ||
        t->layers[0][0].heads != cache.n_kv_heads() || t->layers[0][0].dim != cache.head_dim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the transform form needs transforms of the cache's ", cache.n_layers(),
                       " layers of ", cache.n_kv_heads(), " KV heads of ", cache.head_dim()));
    }
  }
  if (rows == 0) return absl::OkStatus();
  if (form == WireForm::kPlain) {
    if (bytes != nullptr) {
      *bytes = static_cast<int64_t>(layers.size()) *
               LayerWireBytes(form, rows, cache.n_kv_heads(), cache.head_dim(), cache.dtype());
    }
    return absl::OkStatus();
  }
  std::vector<float> buf(rows * cache.width());
  std::string chunk;
  for (int32_t layer : layers) {
    for (const bool values : {false, true}) {
      RETURN_IF_ERROR(values ? cache.ReadValues(layer, 0, rows, buf.data())
                             : cache.ReadKeys(layer, 0, rows, buf.data()));
      if (transform) {
        const LayerTransform& t = transforms->transforms->layers[layer][values ? 1 : 0];
        const float step = TransformStep(t, transforms->step_ratio);
        RETURN_IF_ERROR(
            EncodeTransformChunk(t, step, buf.data(), 0, rows, kTransformWireZstdLevel, &chunk));
        RETURN_IF_ERROR(DecodeTransformChunk(t, step, chunk, 0, rows, buf.data()));
        if (bytes != nullptr) *bytes += static_cast<int64_t>(chunk.size());
      } else {
        RETURN_IF_ERROR(RoundTrip(form, values, buf.data(), 0, rows, cache.n_kv_heads(),
                                  cache.head_dim(), cache.dtype()));
        if (bytes != nullptr) {
          *bytes += EncodedBytes(form, values, 0, rows, cache.n_kv_heads(), cache.head_dim(),
                                 cache.dtype());
        }
      }
      RETURN_IF_ERROR(values ? cache.WriteValues(layer, 0, rows, buf.data())
                             : cache.WriteKeys(layer, 0, rows, buf.data()));
    }
  }
  return absl::OkStatus();
}

}  // namespace riskkv
