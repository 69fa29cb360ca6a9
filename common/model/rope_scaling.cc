#include "common/model/rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

absl::Status Bad(const std::string& type, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("RoPE scaling '", type, "': ", what));
}

double InvFreq(double base, int64_t i, int64_t rot_dim) {
  return std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
}

// Llama 3: wavelengths beyond original_context / low_freq_factor are interpolated by `factor`,
// those below original_context / high_freq_factor kept, the band between blended smoothly.
RopeScaling Llama3(const RopeScalingSpec& s, double base, int64_t rot_dim) {
  RopeScaling out;
  const double ctx = static_cast<double>(s.original_context);
  const double low_wavelen = ctx / s.low_freq_factor, high_wavelen = ctx / s.high_freq_factor;
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    const double wavelen = 2 * std::numbers::pi / InvFreq(base, i, rot_dim);
    double keep = 1.0;  // share of the unscaled frequency
    if (wavelen > low_wavelen) {
      keep = 0.0;
    } else if (wavelen >= high_wavelen) {
      keep = (ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    }
    out.freq_divisors.push_back(1.0 / ((1.0 - keep) / s.factor + keep));
  }
  return out;
}

// YaRN: the dimensions that turn fewer than beta_slow times over the original context are
// interpolated, those that turn more than beta_fast times kept, a linear ramp between; cos and
// sin are scaled by the attention factor.
RopeScaling Yarn(const RopeScalingSpec& s, double base, int64_t rot_dim) {
  RopeScaling out;
  const double dim = static_cast<double>(rot_dim);
  const double ctx = static_cast<double>(s.original_context);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(ctx / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(s.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(s.beta_slow)), dim - 1);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < rot_dim / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1.0 - ramp;  // extrapolation share
    out.freq_divisors.push_back(1.0 / ((1.0 - keep) / s.factor + keep));
  }
  out.attn_factor = s.attention_factor > 0 ? s.attention_factor
                                           : (s.factor <= 1 ? 1.0 : 0.1 * std::log(s.factor) + 1.0);
  return out;
}

}  // namespace

absl::StatusOr<RopeScaling> ComputeRopeScaling(const RopeScalingSpec& s, double base,
                                               int64_t rot_dim) {
  if (s.type == "none") return RopeScaling{};
  if (s.type != "linear" && s.type != "llama3" && s.type != "yarn") {
    return absl::UnimplementedError(absl::StrCat(
        "RoPE scaling '", s.type, "' is not supported (supported: linear, llama3, yarn)"));
  }
  if (!(s.factor >= 1.0) || !std::isfinite(s.factor)) {
    return Bad(s.type, absl::StrCat("factor ", s.factor, " must be a finite number >= 1"));
  }
  if (rot_dim < 2 || !(base > 1)) return Bad(s.type, "needs a RoPE base > 1 and dimension >= 2");
  RopeScaling out;
  if (s.type == "linear") {
    out.freq_divisors.assign(rot_dim / 2, s.factor);
  } else {
    if (s.original_context <= 0 || s.original_context > (int64_t{1} << 30)) {
      return Bad(s.type, absl::StrCat("original context length ", s.original_context,
                                      " must be in [1, 2^30]"));
    }
    if (s.type == "llama3") {
      if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
          !std::isfinite(s.high_freq_factor)) {
        return Bad(s.type,
                   absl::StrCat("low_freq_factor ", s.low_freq_factor, " and high_freq_factor ",
                                s.high_freq_factor, " must satisfy 0 < low < high"));
      }
      out = Llama3(s, base, rot_dim);
    } else {
      if (!(s.beta_fast > 0) || !(s.beta_slow > 0) || !std::isfinite(s.beta_fast) ||
          !std::isfinite(s.beta_slow) || !(s.attention_factor >= 0) ||
          !std::isfinite(s.attention_factor)) {
        return Bad(s.type, "beta_fast and beta_slow must be > 0, attention_factor >= 0");
      }
      out = Yarn(s, base, rot_dim);
    }
  }
  out.type = s.type;
  return out;
}

absl::StatusOr<RopeScaling> RopeScalingFromFactors(std::vector<double> factors, int64_t rot_dim) {
  if (static_cast<int64_t>(factors.size()) != rot_dim / 2) {
    return absl::InvalidArgumentError(absl::StrCat("RoPE frequency factors: ", factors.size(),
                                                   " values for ", rot_dim / 2,
                                                   " rotated dimension pairs"));
  }
  for (size_t i = 0; i < factors.size(); ++i) {
    if (!(factors[i] > 0) || !std::isfinite(factors[i])) {
      return absl::InvalidArgumentError(absl::StrCat("RoPE frequency factor ", i, " is ",
                                                     factors[i], ", not a finite number > 0"));
    }
  }
  RopeScaling out;
  out.freq_divisors = std::move(factors);
  out.type = "llama3";
  return out;
}

}  // namespace riskkv
