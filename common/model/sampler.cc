// Greedy and stochastic token selection with a serializable RNG.
#include "common/model/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"

namespace riskkv {

absl::Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature)) return absl::InvalidArgumentError("temperature must be finite");
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  return absl::OkStatus();
}

absl::StatusOr<Sampler> Sampler::Create(const SamplingParams& params) {
  if (auto s = params.Validate(); !s.ok()) return s;
  return Sampler(params);
}

int32_t Argmax(std::span<const float> logits) {
  // NaN never wins: comparisons with NaN are false, so it is skipped rather than sticking.
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best] || std::isnan(logits[best])) best = i;
  }
  return best;
}

int32_t Sampler::Sample(std::span<const float> raw_logits) {
  if (params_.temperature <= 0.0f) return Argmax(raw_logits);
  // A NaN logit carries no probability; +inf would make every weight NaN, so a non-finite
  // maximum falls back to greedy. Either way the RNG advances exactly once.
  std::vector<float> clean(raw_logits.begin(), raw_logits.end());
  bool finite_max = false;
  for (float& v : clean) {
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
    if (std::isfinite(v)) finite_max = true;
    if (v == std::numeric_limits<float>::infinity()) {
      finite_max = false;
      break;
    }
  }
  if (!finite_max) {
    rng_();
    return Argmax(raw_logits);
  }
  std::span<const float> logits(clean);
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  // Sort by logit descending, ties by id, so the order is deterministic across platforms.
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t keep = vocab;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    keep = params_.top_k;
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), by_logit);
  } else {
    std::sort(ids.begin(), ids.end(), by_logit);
  }
  std::vector<double> probs(keep);
  const double inv_t = 1.0 / params_.temperature;
  const double mx = logits[ids[0]];
  double sum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[ids[i]] - mx) * inv_t);
    sum += probs[i];
  }
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    int32_t cut = keep;
    for (int32_t i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  // One 53-bit uniform draw in [0, 1) from the raw engine output, independent of the
  // standard library's distribution implementations.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double cum = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    cum += probs[i];
    if (u < cum) return ids[i];
  }
  return ids[keep - 1];
}

std::string Sampler::SaveState() const {
  std::ostringstream out;
  out << rng_;
  return out.str();
}

absl::Status Sampler::RestoreState(const std::string& state) {
  std::istringstream in(state);
  std::mt19937_64 restored;
  in >> restored;
  if (in.fail()) return absl::InvalidArgumentError("malformed sampler RNG state");
  in >> std::ws;
  if (!in.eof()) return absl::InvalidArgumentError("trailing data after sampler RNG state");
  rng_ = restored;
  return absl::OkStatus();
}

}  // namespace riskkv
