// Top-token references and the KL divergence against them (see top_logprobs.h).
#include "common/model/top_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/sampler.h"
#include "kernels/cpu/fixed_order.h"

namespace riskkv {

void TopLogProbs(std::span<const float> logits, int64_t k, int32_t* ids, float* logp) {
  TopLogProbs(logits, k, ids, logp,
              cpu::LogSumExp(logits.data(), static_cast<int64_t>(logits.size())));
}

void TopLogProbs(std::span<const float> logits, int64_t k, int32_t* ids, float* logp, double lse) {
  const auto vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  // NaN ranks below every number, so the order stays strict whatever the logits hold.
  const auto key = [&](int32_t a) {
    const float v = logits[a];
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return key(a) > key(b) || (key(a) == key(b) && a < b);
  });
  for (int64_t j = 0; j < k; ++j) {
    ids[j] = order[j];
    logp[j] = static_cast<float>(logits[order[j]] - lse);
  }
}

double TopKl(std::span<const int32_t> ids, std::span<const float> logp,
             std::span<const float> logits) {
  return TopKl(ids, logp, logits,
               cpu::LogSumExp(logits.data(), static_cast<int64_t>(logits.size())));
}

double TopKl(std::span<const int32_t> ids, std::span<const float> logp,
             std::span<const float> logits, double lse) {
  double divergence = 0.0, p_top = 0.0, q_top = 0.0;
  for (size_t j = 0; j < ids.size(); ++j) {
    const double p = std::exp(static_cast<double>(logp[j]));
    const double log_q = logits[ids[j]] - lse;
    divergence += p * (logp[j] - log_q);
    p_top += p;
    q_top += std::exp(log_q);
  }
  // The rest of the vocabulary as one outcome, unless its mass is within the rounding of the
  // reference's float log-probabilities (then it is noise, and its log ratio unbounded).
  const double p_rest = std::max(0.0, 1.0 - p_top), q_rest = std::max(1e-300, 1.0 - q_top);
  if (p_rest > 1e-7 * static_cast<double>(ids.size())) {
    divergence += p_rest * std::log(p_rest / q_rest);
  }
  return std::isnan(divergence) ? divergence : std::max(0.0, divergence);
}

bool TopAgrees(std::span<const int32_t> ids, std::span<const float> logits) {
  return !ids.empty() && Argmax(logits) == ids[0];
}

absl::Status CheckTopLogProbs(std::span<const int32_t> ids, std::span<const float> logp,
                              int64_t vocab) {
  if (ids.empty() || static_cast<int64_t>(ids.size()) > kTopTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " reference tokens; 1 to ", kTopTokens, " expected"));
  }
  if (logp.size() != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ids.size(), " reference tokens with ", logp.size(), " log-probabilities"));
  }
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || sorted.back() >= vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference token ", sorted.front() < 0 ? sorted.front() : sorted.back(),
                     " is outside the vocabulary of ", vocab));
  }
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return absl::InvalidArgumentError("a reference token is listed twice");
  }
  double total = 0.0;
  for (size_t j = 0; j < logp.size(); ++j) {
    const float v = logp[j];
    if (!std::isfinite(v) || v > 1e-3f) {
      return absl::InvalidArgumentError(
          absl::StrCat("reference log-probability ", v, " is not a finite value <= 0"));
    }
    if (j > 0 && v > logp[j - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("reference log-probabilities are not most likely first (", logp[j - 1],
                       " then ", v, ")"));
    }
    total += std::exp(static_cast<double>(v));
  }
  if (total > 1.0 + 1e-3) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference probabilities sum to ", total, ", more than 1"));
  }
  return absl::OkStatus();
}

}  // namespace riskkv
