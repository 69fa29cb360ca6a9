// Summaries of paired per-request measurements for the calibration pipeline: one configuration
// against exact KV on the same requests, and the agreement of two risk orders.
#pragma once

#include <span>

#include "absl/status/statusor.h"
#include "services/calibrate/calibrate.h"

namespace riskkv {

// Paired summary of `rebuilt` against `exact` (per-request mean NLLs of the same requests):
// the deltas, their bootstrap intervals (o.bootstrap_resamples, o.seed) and the requests whose
// delta exceeds o.epsilon, over all requests and for each of n_kinds kinds of text (`kinds`
// gives each request's; a kind without requests is refused).
absl::StatusOr<Measured> Summarize(std::span<const double> rebuilt, std::span<const double> exact,
                                   std::span<const int> kinds, int n_kinds,
                                   const CalibrateOptions& o);

// Spearman rank correlation (average ranks for ties); 0 when either side is constant.
double RankCorrelation(std::span<const double> a, std::span<const double> b);

}  // namespace riskkv
