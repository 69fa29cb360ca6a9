// What a target holds after receiving layers in a wire form, made offline: the calibration's way
// of measuring a wire form's damage (and of rebuilding from the decoded anchors, as a target
// does) without a network.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "common/kvcodec/wire_form.h"
#include "common/model/kv_cache.h"
#include "common/recovery/predictor_bank.h"

namespace riskkv {

// The transform form's parameters: the transforms of every layer (as the bank holds them) and
// the policy's step ratio (transform_codec.h TransformStep).
struct WireTransforms {
  const BankTransforms* transforms = nullptr;
  double step_ratio = 0.0;
};

// Replaces K and V rows [0, rows) of each of `layers` in `cache` by what a migration in `form`
// delivers into a cache of the same dtype: the rows as the sender reads them (f32), encoded,
// decoded and written back (kv_codec.h RoundTrip; for the transform form its wire chunk, which
// decodes the same however the rows are cut). Plain leaves the rows as they are. When `bytes`
// is given it receives the bytes those rows take in `form` (plain: in the cache's dtype).
// InvalidArgument for a layer or row count outside the cache, and for the transform form
// without transforms for every layer of the cache's shape.
absl::Status ApplyWireForm(WireForm form, std::span<const int32_t> layers, int64_t rows,
                           KvCache& cache, const WireTransforms* transforms = nullptr,
                           int64_t* bytes = nullptr);

}  // namespace riskkv
