// Summaries of paired per-request measurements (see paired_stats.h).
#include "services/calibrate/paired_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/base/status_macros.h"
#include "common/recovery/quality_gate.h"

namespace riskkv {
namespace {

double Mean(std::span<const double> v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

}  // namespace

absl::StatusOr<Measured> Summarize(std::span<const double> rebuilt, std::span<const double> exact,
                                   const CalibrateOptions& o) {
  Measured m;
  for (size_t r = 0; r < exact.size(); ++r) {
    m.deltas.push_back(rebuilt[r] - exact[r]);
    if (m.deltas.back() > o.epsilon) ++m.violations;
  }
  const BootstrapOptions boot{o.bootstrap_resamples, o.seed};
  ASSIGN_OR_RETURN(m.ci95, BootstrapMeanInterval(m.deltas, 0.95, boot));
  ASSIGN_OR_RETURN(m.upper90, BootstrapUpperBound(m.deltas, 0.9, boot));
  m.exact_nll = Mean(exact);
  m.rebuilt_nll = Mean(rebuilt);
  return m;
}

double RankCorrelation(std::span<const double> a, std::span<const double> b) {
  auto ranks = [](std::span<const double> v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * static_cast<double>(i + j);
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const double ma = Mean(ra), mb = Mean(rb);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

}  // namespace riskkv
