// Summaries of paired per-request measurements (see paired_stats.h).
#include "services/calibrate/paired_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/quality_gate.h"

namespace riskkv {
namespace {

double Mean(std::span<const double> v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

}  // namespace

namespace {

absl::StatusOr<DeltaSummary> SummarizeDeltas(std::span<const double> rebuilt,
                                             std::span<const double> exact,
                                             std::span<const double> deltas,
                                             const CalibrateOptions& o) {
  DeltaSummary m;
  for (double d : deltas) m.violations += d > o.epsilon ? 1 : 0;
  const BootstrapOptions boot{o.bootstrap_resamples, o.seed};
  ASSIGN_OR_RETURN(m.ci95, BootstrapMeanInterval(deltas, 0.95, boot));
  ASSIGN_OR_RETURN(m.upper90, BootstrapUpperBound(deltas, 0.9, boot));
  m.exact_nll = Mean(exact);
  m.rebuilt_nll = Mean(rebuilt);
  m.requests = static_cast<int>(deltas.size());
  return m;
}

}  // namespace

absl::StatusOr<Measured> Summarize(std::span<const double> rebuilt, std::span<const double> exact,
                                   std::span<const int> kinds, int n_kinds,
                                   const CalibrateOptions& o) {
  if (rebuilt.size() != exact.size() || kinds.size() != exact.size()) {
    return absl::InvalidArgumentError(absl::StrCat("paired summary of ", rebuilt.size(), " and ",
                                                   exact.size(), " requests with ", kinds.size(),
                                                   " kinds"));
  }
  Measured m;
  for (size_t r = 0; r < exact.size(); ++r) m.deltas.push_back(rebuilt[r] - exact[r]);
  ASSIGN_OR_RETURN(DeltaSummary all, SummarizeDeltas(rebuilt, exact, m.deltas, o));
  static_cast<DeltaSummary&>(m) = all;
  for (int k = 0; k < n_kinds; ++k) {
    std::vector<double> kr, ke, kd;
    for (size_t r = 0; r < exact.size(); ++r) {
      if (kinds[r] != k) continue;
      kr.push_back(rebuilt[r]);
      ke.push_back(exact[r]);
      kd.push_back(m.deltas[r]);
    }
    if (kd.empty()) return absl::InvalidArgumentError(absl::StrCat("no request of kind ", k));
    ASSIGN_OR_RETURN(DeltaSummary s, SummarizeDeltas(kr, ke, kd, o));
    m.by_kind.push_back(s);
  }
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
