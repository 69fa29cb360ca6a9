// Applying folded maps on a backend.
#include "common/recovery/rebuild.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/features.h"

namespace riskkv {

absl::Status RebuildGroup(KvCache& cache, const FoldedGroup& group, const ModelConfig& config,
                          Backend& backend, int64_t begin, int64_t count) {
  const int64_t w = cache.width();
  const int64_t f = FeatureWidth(group.group, w);
  if (group.maps.size() != group.group.targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group.group.ToString(), " has ",
                                                   group.maps.size(), " maps for ",
                                                   group.group.targets.size(), " targets"));
  }
  for (const FoldedMap& m : group.maps) {
    if (m.k.cols != f || m.v.cols != f || m.k.rows != w || m.v.rows != w ||
        static_cast<int64_t>(m.c_k.size()) != w || static_cast<int64_t>(m.c_v.size()) != w) {
      return absl::InvalidArgumentError(absl::StrCat(
          "folded map of layer ", m.layer, " does not fit features of width ", f, " -> ", w));
    }
  }
  std::vector<float> features(count * f);
  RETURN_IF_ERROR(
      BuildFeatures(cache, group.group, config, backend, begin, count, features.data()));
  std::vector<float> k(count * w), v(count * w);
  std::vector<int32_t> positions(count);
  for (int64_t i = 0; i < count; ++i) positions[i] = static_cast<int32_t>(begin + i);
  for (const FoldedMap& m : group.maps) {
    backend.MatMul(features.data(), count, m.k, m.c_k.data(), k.data());
    backend.MatMul(features.data(), count, m.v, m.c_v.data(), v.data());
    backend.Rope(k.data(), count, config.n_kv_heads, positions.data(), config.rope(),
                 /*inverse=*/false);
    RETURN_IF_ERROR(cache.WriteKeys(m.layer, begin, count, k.data()));
    RETURN_IF_ERROR(cache.WriteValues(m.layer, begin, count, v.data()));
  }
  return absl::OkStatus();
}

}  // namespace riskkv
