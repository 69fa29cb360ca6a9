// Next-token selection: greedy, or temperature / top-k / top-p sampling driven by a seedable
// RNG whose full state can be saved and restored, so a session resumed on another node
// continues the same random stream.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace riskkv {

struct SamplingParams {
  float temperature = 0.0f;  // <= 0 selects greedy (argmax) decoding
  int32_t top_k = 0;         // keep the k most likely tokens; 0 keeps all
  float top_p = 1.0f;        // nucleus: smallest set with cumulative probability >= top_p
  uint64_t seed = 0;         // initial RNG seed

  absl::Status Validate() const;
};

class Sampler {
 public:
  static absl::StatusOr<Sampler> Create(const SamplingParams& params);

  // Picks a token id from logits [vocab]. Consumes exactly one RNG draw when sampling (none
  // when greedy), so two samplers in the same state produce the same stream.
  int32_t Sample(std::span<const float> logits);

  const SamplingParams& params() const { return params_; }
  // The complete RNG state as text (the mt19937_64 standard stream format).
  std::string SaveState() const;
  // Restores a state from SaveState(); malformed text is an InvalidArgument error and leaves
  // the sampler unchanged.
  absl::Status RestoreState(const std::string& state);

 private:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  SamplingParams params_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (lowest index on ties).
int32_t Argmax(std::span<const float> logits);

}  // namespace riskkv
