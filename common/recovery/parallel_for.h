// Splitting a loop of independent iterations over a few threads, for the calibration work that
// runs outside the backend's thread pool (scoring logits, accumulating and solving ridge fits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace riskkv {

// Calls fn(begin, end) on contiguous chunks covering [0, n), one chunk per thread (the calling
// thread takes the first), and returns when all are done. fn must be safe to run concurrently on
// disjoint chunks.
inline void ParallelChunks(int64_t n, int threads,
                           const std::function<void(int64_t, int64_t)>& fn) {
  const int64_t t = std::clamp<int64_t>(threads, 1, std::max<int64_t>(n, 1));
  const int64_t chunk = (n + t - 1) / t;
  std::vector<std::thread> workers;
  for (int64_t i = 1; i < t; ++i) {
    const int64_t begin = i * chunk, end = std::min(n, begin + chunk);
    if (begin < end) workers.emplace_back(fn, begin, end);
  }
  if (n > 0) fn(0, std::min(n, chunk));
  for (std::thread& w : workers) w.join();
}

}  // namespace riskkv
