// The mean of paired differences (a configuration's NLL minus the exact one's, per request) with
// a 95% interval by the normal approximation, as the KV benchmarks report them.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace riskkv::bench {

struct Mean {
  double mean = 0, lo = 0, hi = 0;
};

inline Mean MeanCi(const std::vector<double>& d) {
  const double n = static_cast<double>(d.size());
  if (d.empty()) return {};
  double m = 0, v = 0;
  for (double x : d) m += x / n;
  for (double x : d) v += (x - m) * (x - m) / std::max(1.0, n - 1);
  const double h = 1.96 * std::sqrt(v / n);
  return {m, m - h, m + h};
}

}  // namespace riskkv::bench
