// Conversion between the engine's decoding state (sampling parameters, token history, sampler
// RNG) and its wire form riskkv.v1.DecodingState. The one place these two meet.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/sampler.h"
#include "riskkv/v1/session.pb.h"

namespace riskkv {

// A sampler from its wire parameters (an absent top_p means 1); InvalidArgument naming the field.
absl::StatusOr<Sampler> DecodeSampling(const v1::SamplingParams& proto);

v1::DecodingState EncodeDecodingState(std::span<const int32_t> token_ids, const Sampler& sampler);

struct DecodingState {
  std::vector<int32_t> token_ids;
  Sampler sampler;  // restored: its next draw is the one the source would have made
};

// Validates everything (sampling parameters, negative ids, RNG state text); ids are checked
// against a model's vocabulary later, by the model. Errors name the field.
absl::StatusOr<DecodingState> DecodeDecodingState(const v1::DecodingState& proto);

}  // namespace riskkv
