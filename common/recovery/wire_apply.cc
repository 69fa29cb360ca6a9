#include "common/recovery/wire_apply.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvcodec/kv_codec.h"

namespace riskkv {

absl::Status ApplyWireForm(WireForm form, std::span<const int32_t> layers, int64_t rows,
                           KvCache& cache) {
  if (rows < 0 || rows > cache.n_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat(rows, " rows asked of a cache holding ", cache.n_tokens()));
  }
  if (form == WireForm::kPlain || rows == 0) return absl::OkStatus();
  std::vector<float> buf(rows * cache.width());
  for (int32_t layer : layers) {
    if (layer < 0 || layer >= cache.n_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " is outside the cache's ", cache.n_layers()));
    }
    for (const bool values : {false, true}) {
      RETURN_IF_ERROR(values ? cache.ReadValues(layer, 0, rows, buf.data())
                             : cache.ReadKeys(layer, 0, rows, buf.data()));
      RETURN_IF_ERROR(RoundTrip(form, values, buf.data(), 0, rows, cache.n_kv_heads(),
                                cache.head_dim(), cache.dtype()));
      RETURN_IF_ERROR(values ? cache.WriteValues(layer, 0, rows, buf.data())
                             : cache.WriteKeys(layer, 0, rows, buf.data()));
    }
  }
  return absl::OkStatus();
}

}  // namespace riskkv
