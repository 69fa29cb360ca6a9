// Online reconstruction: features from the anchors' exact KV, the folded maps, RoPE on the
// rebuilt keys, written straight into the KV cache.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/kv_cache.h"
#include "common/model/model_config.h"
#include "common/recovery/folded_map.h"
#include "kernels/backend.h"

namespace riskkv {

// Rebuilds every target layer of `group` for positions [begin, begin + count); the anchors'
// rows must already hold exact KV. Other layers are not touched.
absl::Status RebuildGroup(KvCache& cache, const FoldedGroup& group, const ModelConfig& config,
                          Backend& backend, int64_t begin, int64_t count);

}  // namespace riskkv
