// The sender-side token bucket on a fake clock: bursts, debt, and the rate it enforces.
#include "services/node/rate_limiter.h"

#include <gtest/gtest.h>

namespace riskkv {
namespace {

struct FakeClock {
  RateLimiter::Clock::time_point now{};
  std::vector<double> sleeps;  // seconds asked for
  RateLimiter Limiter(double bits_per_second, double burst) {
    return RateLimiter(
        bits_per_second, burst, [this] { return now; },
        [this](RateLimiter::Clock::duration d) {
          sleeps.push_back(std::chrono::duration<double>(d).count());
          now += d;
        });
  }
};

TEST(RateLimiter, UnlimitedNeverWaits) {
  FakeClock clock;
  RateLimiter limiter = clock.Limiter(0, 1000);
  limiter.Acquire(1 << 30);
  EXPECT_TRUE(clock.sleeps.empty());
  EXPECT_EQ(limiter.bytes_per_second(), 0);
}

TEST(RateLimiter, SendsTheBurstAtOnceThenPacesAtTheRate) {
  FakeClock clock;
  RateLimiter limiter = clock.Limiter(8000, 1000);  // 1000 bytes per second
  EXPECT_EQ(limiter.bytes_per_second(), 1000);
  limiter.Acquire(1000);  // the burst
  EXPECT_TRUE(clock.sleeps.empty());
  limiter.Acquire(500);  // half a second of debt
  ASSERT_EQ(clock.sleeps.size(), 1u);
  EXPECT_NEAR(clock.sleeps[0], 0.5, 1e-9);
  // 10 000 bytes more take 10 s in all, whatever the chunking.
  for (int i = 0; i < 10; ++i) limiter.Acquire(1000);
  double total = 0;
  for (double s : clock.sleeps) total += s;
  EXPECT_NEAR(total, 10.5, 1e-6);
}

TEST(RateLimiter, IdleTimeRefillsTheBucketUpToTheBurst) {
  FakeClock clock;
  RateLimiter limiter = clock.Limiter(8000, 1000);
  limiter.Acquire(1000);
  clock.now += std::chrono::seconds(60);  // a minute idle refills 1000 bytes, not 60 000
  limiter.Acquire(1000);
  EXPECT_TRUE(clock.sleeps.empty());
  limiter.Acquire(1000);
  ASSERT_EQ(clock.sleeps.size(), 1u);
  EXPECT_NEAR(clock.sleeps[0], 1.0, 1e-9);
}

}  // namespace
}  // namespace riskkv
