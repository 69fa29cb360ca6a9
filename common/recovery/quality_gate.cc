// Percentile bootstrap and the selection gates.
#include "common/recovery/quality_gate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

absl::Status CheckDeltas(std::span<const double> deltas) {
  if (deltas.empty()) return absl::InvalidArgumentError("no per-request deltas");
  for (double d : deltas) {
    if (!std::isfinite(d)) return absl::InvalidArgumentError("a per-request delta is not finite");
  }
  return absl::OkStatus();
}

double Mean(std::span<const double> v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Sorted means of `resamples` resamples with replacement.
std::vector<double> BootstrapMeans(std::span<const double> deltas, const BootstrapOptions& o) {
  std::mt19937_64 rng(o.seed);
  const uint64_t n = deltas.size();
  std::vector<double> means(o.resamples);
  for (double& m : means) {
    double s = 0.0;
    for (uint64_t i = 0; i < n; ++i) s += deltas[rng() % n];
    m = s / static_cast<double>(n);
  }
  std::sort(means.begin(), means.end());
  return means;
}

// Linear interpolation between order statistics (the "type 7" quantile).
double Quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  const size_t j = std::min(i + 1, sorted.size() - 1);
  return sorted[i] + (pos - static_cast<double>(i)) * (sorted[j] - sorted[i]);
}

absl::Status CheckOptions(const BootstrapOptions& o) {
  if (o.resamples < 100 || o.resamples > 1000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("bootstrap resamples ", o.resamples, " not in [100, 1000000]"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* GateName(Gate gate) {
  switch (gate) {
    case Gate::kMean:
      return "mean";
    case Gate::kUpper90:
      return "upper90";
    case Gate::kStableSplit:
      return "stable-split";
  }
  return "?";
}

absl::StatusOr<Interval> BootstrapMeanInterval(std::span<const double> deltas, double confidence,
                                               const BootstrapOptions& options) {
  if (auto s = CheckDeltas(deltas); !s.ok()) return s;
  if (auto s = CheckOptions(options); !s.ok()) return s;
  if (!(confidence > 0.0 && confidence < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("confidence ", confidence, " not in (0, 1)"));
  }
  const std::vector<double> means = BootstrapMeans(deltas, options);
  const double tail = (1.0 - confidence) / 2.0;
  return Interval{Mean(deltas), Quantile(means, tail), Quantile(means, 1.0 - tail)};
}

absl::StatusOr<double> BootstrapUpperBound(std::span<const double> deltas, double level,
                                           const BootstrapOptions& options) {
  if (auto s = CheckDeltas(deltas); !s.ok()) return s;
  if (auto s = CheckOptions(options); !s.ok()) return s;
  if (!(level > 0.0 && level < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("level ", level, " not in (0, 1)"));
  }
  return Quantile(BootstrapMeans(deltas, options), level);
}

namespace {

// Requests of each kind: `kinds` parallel to `values`, or one kind when empty.
absl::StatusOr<std::vector<std::vector<double>>> ByKind(std::span<const double> values,
                                                        std::span<const int> kinds, int n_kinds,
                                                        const char* what) {
  if (kinds.empty()) return std::vector<std::vector<double>>{{values.begin(), values.end()}};
  if (kinds.size() != values.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", kinds.size(), " kinds for ", values.size(), " requests"));
  }
  std::vector<std::vector<double>> out(n_kinds);
  for (size_t i = 0; i < values.size(); ++i) {
    if (kinds[i] < 0 || kinds[i] >= n_kinds) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": bad kind ", kinds[i]));
    }
    out[kinds[i]].push_back(values[i]);
  }
  for (int k = 0; k < n_kinds; ++k) {
    if (out[k].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": no request of kind ", k));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<GateDecision> ApplyGate(Gate gate, std::span<const PathPoint> path, double epsilon,
                                       const BootstrapOptions& options) {
  if (!std::isfinite(epsilon) || epsilon < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat("budget epsilon ", epsilon, " must be >= 0"));
  }
  GateDecision d;
  double best_saved = -1.0;
  for (size_t i = 0; i < path.size(); ++i) {
    const PathPoint& p = path[i];
    if (auto s = CheckDeltas(p.deltas); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("path point ", i, ": ", s.message()));
    }
    const int n_kinds = p.kinds.empty() ? 1 : *std::max_element(p.kinds.begin(), p.kinds.end()) + 1;
    const std::string where = absl::StrCat("path point ", i);
    auto selection = ByKind(p.deltas, p.kinds, n_kinds, where.c_str());
    if (!selection.ok()) return selection.status();
    std::vector<std::vector<double>> confirm;
    if (gate == Gate::kStableSplit) {
      if (auto s = CheckDeltas(p.confirm); !s.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("path point ", i, " confirmation set: ", s.message()));
      }
      auto c = ByKind(p.confirm, p.confirm_kinds, n_kinds, (where + " confirmation").c_str());
      if (!c.ok()) return c.status();
      confirm = std::move(*c);
    }
    double stat = -std::numeric_limits<double>::infinity();
    int worst = 0;
    for (int k = 0; k < n_kinds; ++k) {
      const std::vector<double>& deltas = (*selection)[k];
      double s = 0.0;
      switch (gate) {
        case Gate::kMean:
          s = Mean(deltas);
          break;
        case Gate::kUpper90: {
          auto ub = BootstrapUpperBound(deltas, 0.9, options);
          if (!ub.ok()) return ub.status();
          s = *ub;
          break;
        }
        case Gate::kStableSplit: {
          // Upper-90 on the selection requests, and additionally the mean on independent
          // ones: the worse of the two decides, so this gate is never looser than Upper-90.
          auto ub = BootstrapUpperBound(deltas, 0.9, options);
          if (!ub.ok()) return ub.status();
          s = std::max(*ub, Mean(confirm[k]));
          break;
        }
      }
      if (s > stat) {
        stat = s;
        worst = k;
      }
    }
    const bool pass = stat <= epsilon;
    d.statistic.push_back(stat);
    d.passed.push_back(pass);
    d.worst_kind.push_back(worst);
    if (pass && p.kv_saved > best_saved) {
      best_saved = p.kv_saved;
      d.chosen = static_cast<int>(i);
    }
  }
  return d;
}

}  // namespace riskkv
