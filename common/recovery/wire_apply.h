// What a target holds after receiving layers in a wire form, made offline: the calibration's way
// of measuring a wire form's damage (and of rebuilding from the dequantized anchors, as a target
// does) without a network.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/kvcodec/wire_form.h"
#include "common/model/kv_cache.h"

namespace riskkv {

// Replaces K and V rows [0, rows) of each of `layers` in `cache` by what a migration in `form`
// delivers into a cache of the same dtype: the rows as the sender reads them (f32), encoded,
// decoded (kv_codec.h RoundTrip) and written back. Plain leaves the rows as they are.
// InvalidArgument for a layer or row count outside the cache.
absl::Status ApplyWireForm(WireForm form, std::span<const int32_t> layers, int64_t rows,
                           KvCache& cache);

}  // namespace riskkv
