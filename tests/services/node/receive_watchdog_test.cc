// The receive watchdog: each of its bounds fires on its own, the hook runs before the call is
// cancelled (a source asking why right after its stream broke must hear the reason), and a
// disarmed watchdog never fires.
#include "services/node/receive_watchdog.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace riskkv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::system_clock;

// What a watchdog did: whether the hook ran before the cancel, and what it was told.
struct Seen {
  absl::Mutex mu;
  bool hooked ABSL_GUARDED_BY(mu) = false;
  bool hooked_before_cancel ABSL_GUARDED_BY(mu) = false;
  ReceiveWatchdog::Firing firing ABSL_GUARDED_BY(mu);
  absl::Notification cancelled;

  std::function<void()> Cancel() {
    return [this] {
      {
        absl::MutexLock lock(&mu);
        hooked_before_cancel = hooked;
      }
      cancelled.Notify();
    };
  }
  ReceiveWatchdog::Hook Hook() {
    return [this](const ReceiveWatchdog::Firing& f) {
      absl::MutexLock lock(&mu);
      hooked = true;
      firing = f;
    };
  }
};

TEST(ReceiveWatchdog, NoHandshakeWithinItsBoundFiresAndTheHookRunsFirst) {
  Seen seen;
  ReceiveWatchdog w(seen.Cancel(), system_clock::now() + seconds(30), seconds(10),
                    milliseconds(50));
  w.OnFire(seen.Hook());
  ASSERT_TRUE(seen.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(w.fired().has_value());
  EXPECT_EQ(w.fired()->bound, "no_handshake");
  EXPECT_FALSE(w.Disarm());  // too late: it fired
  absl::MutexLock lock(&seen.mu);
  EXPECT_TRUE(seen.hooked_before_cancel);
  EXPECT_EQ(seen.firing.bound, "no_handshake");
}

TEST(ReceiveWatchdog, TheDeadlineFiresWhileTheSourceKeepsSending) {
  Seen seen;
  ReceiveWatchdog w(seen.Cancel(), system_clock::now() + milliseconds(300), seconds(10),
                    seconds(10));
  w.OnFire(seen.Hook());
  w.Touch();
  while (!seen.cancelled.HasBeenNotified()) {
    w.Busy(100);
    w.Touch();
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(w.fired()->bound, "deadline");
  absl::MutexLock lock(&seen.mu);
  EXPECT_TRUE(seen.hooked_before_cancel);
  EXPECT_GT(seen.firing.received_bytes, 0);
}

TEST(ReceiveWatchdog, ASilentSourceIsIdleAndASlowOneIsSlow) {
  {
    Seen seen;
    ReceiveWatchdog w(seen.Cancel(), system_clock::now() + seconds(30), milliseconds(100),
                      seconds(10));
    w.Touch();
    ASSERT_TRUE(seen.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)));
    EXPECT_EQ(w.fired()->bound, "idle");
  }
  {
    // 10 bytes a few times a second against a minimum of 1 MB/s after a 0.2 s grace.
    Seen seen;
    ReceiveWatchdog w(seen.Cancel(), system_clock::now() + seconds(30), seconds(10), seconds(10),
                      {.min_bytes_per_second = 1e6, .grace = milliseconds(200)});
    w.OnFire(seen.Hook());
    w.Touch();
    while (!seen.cancelled.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      w.Busy(10);
      w.Touch();
    }
    EXPECT_EQ(w.fired()->bound, "slow");
    absl::MutexLock lock(&seen.mu);
    EXPECT_TRUE(seen.hooked_before_cancel);
    EXPECT_GT(seen.firing.waited_seconds, 0.2);
    EXPECT_LT(seen.firing.received_bytes, 1e6 * seen.firing.waited_seconds);
  }
}

TEST(ReceiveWatchdog, ADisarmedWatchdogNeverFires) {
  Seen seen;
  {
    ReceiveWatchdog w(seen.Cancel(), system_clock::now() + milliseconds(100), milliseconds(50),
                      milliseconds(50));
    w.OnFire(seen.Hook());
    EXPECT_TRUE(w.Disarm());
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_FALSE(w.fired().has_value());
  }
  EXPECT_FALSE(seen.cancelled.HasBeenNotified());
  absl::MutexLock lock(&seen.mu);
  EXPECT_FALSE(seen.hooked);
}

}  // namespace
}  // namespace riskkv
