// Summaries of paired per-request measurements for the calibration pipeline: one configuration
// against exact KV on the same requests, and the agreement of two risk orders.
#pragma once

#include <span>

#include "absl/status/statusor.h"
#include "services/calibrate/calibrate.h"

namespace riskkv {

// Paired summary of `rebuilt` against `exact` (per-request mean NLLs of the same requests):
// the deltas, their bootstrap intervals (o.bootstrap_resamples, o.seed) and the requests whose
// delta exceeds o.epsilon.
absl::StatusOr<Measured> Summarize(std::span<const double> rebuilt, std::span<const double> exact,
                                   const CalibrateOptions& o);

// Spearman rank correlation (average ranks for ties); 0 when either side is constant.
double RankCorrelation(std::span<const double> a, std::span<const double> b);

}  // namespace riskkv
