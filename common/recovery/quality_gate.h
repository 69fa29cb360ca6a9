// Statistics of RISK-KV's offline selection: paired bootstrap intervals of the mean NLL increase
// over requests, and the quality gates that pick the largest configuration along the ordered
// path whose damage stays within a budget, falling back to exact KV when none does.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

namespace riskkv {

struct Interval {
  double mean = 0.0;
  double lo = 0.0;
  double hi = 0.0;
};

struct BootstrapOptions {
  int resamples = 2000;  // bootstrap replicates
  uint64_t seed = 0;     // replicates are a pure function of (deltas, seed)
};

// Percentile bootstrap interval of the mean of paired per-request differences
// (delta_i = NLL with rebuilt KV - NLL with exact KV, same request). Two-sided at `confidence`.
absl::StatusOr<Interval> BootstrapMeanInterval(std::span<const double> deltas, double confidence,
                                               const BootstrapOptions& options = {});

// One-sided upper bound of the mean at `level` (0.9: the 90th percentile of the bootstrap means).
absl::StatusOr<double> BootstrapUpperBound(std::span<const double> deltas, double level,
                                           const BootstrapOptions& options = {});

enum class Gate {
  kMean,         // mean delta <= epsilon
  kUpper90,      // one-sided 90% bootstrap upper bound of the mean <= epsilon
  kStableSplit,  // Upper-90 on the selection requests and mean <= epsilon on independent ones
};
const char* GateName(Gate gate);

// One configuration on the ordered path.
struct PathPoint {
  double kv_saved = 0.0;        // fraction (or bytes) of KV omitted; larger is better
  std::vector<double> deltas;   // per-request NLL increase on the selection requests
  std::vector<double> confirm;  // the same on independent requests (kStableSplit only)
  // The kind of text of each request (parallel to deltas and confirm; empty: one kind). Every
  // kind must have requests in deltas (and, for kStableSplit, in confirm).
  std::vector<int> kinds, confirm_kinds;
};

struct GateDecision {
  int chosen = -1;                // index into the path; -1 means keep every layer exact
  std::vector<double> statistic;  // per point: the value compared with epsilon
  std::vector<bool> passed;       // per point
  std::vector<int> worst_kind;    // per point: the kind whose statistic it is
};

// Evaluates every point and chooses the one with the most KV saved among those that pass. With
// several kinds of text the statistic is the worst kind's: each gate's statistic computed on
// every kind's requests alone, and the largest compared with epsilon.
absl::StatusOr<GateDecision> ApplyGate(Gate gate, std::span<const PathPoint> path, double epsilon,
                                       const BootstrapOptions& options = {});

}  // namespace riskkv
