// Scaled RoPE as checkpoints declare it: Llama 3's frequency factors, linear position
// interpolation and YaRN, from a Hugging Face config.json "rope_scaling" object or GGUF
// metadata (llama.cpp writes Llama 3's factors as the tensor rope_freqs.weight). Each becomes one
// divisor per rotated dimension pair and a magnitude factor on cos and sin (RopeParams).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace riskkv {

struct RopeScalingSpec {
  std::string type = "none";  // "none", "linear", "llama3" or "yarn"
  double factor = 1.0;
  // llama3: the context the unscaled model was trained for and the wavelength band edges.
  int64_t original_context = 0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // yarn: rotations at which the ramp between interpolation and extrapolation starts and ends,
  // and the magnitude factor (0 = 0.1 ln(factor) + 1, as transformers and llama.cpp default).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;
};

struct RopeScaling {
  std::vector<double> freq_divisors;  // rot_dim / 2 values; empty when unscaled
  double attn_factor = 1.0;
  std::string type = "none";
};

// The divisors and factor of `spec` for RoPE of base `base` over `rot_dim` dimensions, with
// transformers' formulas (_compute_llama3_parameters, _compute_yarn_parameters). Parameters
// outside their domain are an InvalidArgument naming them.
absl::StatusOr<RopeScaling> ComputeRopeScaling(const RopeScalingSpec& spec, double base,
                                               int64_t rot_dim);

// Per-pair divisors read from a file (GGUF rope_freqs.weight): rot_dim / 2 finite values > 0.
absl::StatusOr<RopeScaling> RopeScalingFromFactors(std::vector<double> factors, int64_t rot_dim);

}  // namespace riskkv
