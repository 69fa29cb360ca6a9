// The sender-side token bucket (see rate_limiter.h).
#include "services/node/rate_limiter.h"

#include <algorithm>
#include <thread>

namespace riskkv {

RateLimiter::RateLimiter(double bits_per_second, double burst_bytes, Now now, Sleep sleep)
    : rate_(std::max(0.0, bits_per_second / 8.0)),
      burst_(burst_bytes),
      now_(now ? std::move(now) : Now([] { return Clock::now(); })),
      sleep_(sleep ? std::move(sleep)
                   : Sleep([](Clock::duration d) { std::this_thread::sleep_for(d); })),
      tokens_(burst_bytes),
      last_(now_()) {}

void RateLimiter::Acquire(int64_t bytes) {
  if (rate_ <= 0) return;
  double wait = 0;
  {
    absl::MutexLock lock(&mu_);
    const Clock::time_point now = now_();
    tokens_ =
        std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    tokens_ -= static_cast<double>(bytes);
    if (tokens_ < 0) wait = -tokens_ / rate_;
  }
  // Outside the lock: others queue behind the debt this send took on.
  if (wait > 0) {
    sleep_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait)));
  }
}

}  // namespace riskkv
