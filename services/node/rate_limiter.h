// A sender-side token bucket emulating a link of fixed rate, shared by a node's migrations.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace riskkv {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  // Waits for a duration; tests pass a fake that advances their clock.
  using Sleep = std::function<void(Clock::duration)>;
  using Now = std::function<Clock::time_point()>;

  // bits_per_second <= 0: unlimited. Bursts up to `burst_bytes`. `now` and `sleep` default to
  // the steady clock and std::this_thread::sleep_for.
  explicit RateLimiter(double bits_per_second, double burst_bytes = 64 * 1024, Now now = nullptr,
                       Sleep sleep = nullptr);
  // Blocks until `bytes` may be sent. Callers queue behind the debt earlier sends took on.
  void Acquire(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The configured rate (0: unlimited).
  double bytes_per_second() const { return rate_; }

 private:
  const double rate_;
  const double burst_;
  const Now now_;
  const Sleep sleep_;
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_ ABSL_GUARDED_BY(mu_);
};

}  // namespace riskkv
