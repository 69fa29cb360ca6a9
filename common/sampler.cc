// Greedy and stochastic token selection with a serializable RNG.
#include "common/sampler.h"

#include <algorithm>
#include <cmath>
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
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::Sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return Argmax(logits);
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
