// Gathering anchor KV into feature rows.
#include "common/recovery/features.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace riskkv {

absl::Status BuildFeatures(const KvCache& cache, const LayerGroup& group, const ModelConfig& config,
                           Backend& backend, int64_t begin, int64_t count, float* out) {
  const int64_t w = cache.width();
  const int64_t f = FeatureWidth(group, w);
  if (begin < 0 || count < 0 || begin + count > cache.n_tokens()) {
    return absl::OutOfRangeError(absl::StrCat("feature rows [", begin, ", ", begin + count,
                                              ") outside the cache's ", cache.n_tokens(),
                                              " tokens"));
  }
  std::vector<float> k(count * w), v(count * w);
  std::vector<int32_t> positions(count);
  for (int64_t i = 0; i < count; ++i) positions[i] = static_cast<int32_t>(begin + i);
  for (size_t a = 0; a < group.anchors.size(); ++a) {
    const int64_t layer = group.anchors[a];
    RETURN_IF_ERROR(cache.ReadKeys(layer, begin, count, k.data()));
    RETURN_IF_ERROR(cache.ReadValues(layer, begin, count, v.data()));
    backend.Rope(k.data(), count, config.n_kv_heads, positions.data(), config.rope(),
                 /*inverse=*/true);
    for (int64_t i = 0; i < count; ++i) {
      float* row = out + i * f + 2 * a * w;
      std::copy(k.data() + i * w, k.data() + (i + 1) * w, row);
      std::copy(v.data() + i * w, v.data() + (i + 1) * w, row + w);
    }
  }
  return absl::OkStatus();
}

}  // namespace riskkv
