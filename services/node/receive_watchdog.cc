// The receive watchdog (see receive_watchdog.h).
#include "services/node/receive_watchdog.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace riskkv {
namespace {

// How often the thread checks the minimum rate.
constexpr std::chrono::seconds kRateLook(1);

}  // namespace

ReceiveWatchdog::ReceiveWatchdog(std::function<void()> cancel, TimePoint deadline, Duration idle,
                                 Duration handshake, Rate rate)
    : deadline_(deadline),
      idle_(idle),
      handshake_(std::min(idle, handshake)),
      rate_(rate),
      last_(std::chrono::system_clock::now()),
      cancel_(std::move(cancel)) {
  thread_ = std::thread([this] { Run(); });
}

ReceiveWatchdog::Duration ReceiveWatchdog::Waited(TimePoint now) const {
  return busy_ || !touched_ ? waited_ : waited_ + (now - last_);
}

void ReceiveWatchdog::Run() {
  absl::MutexLock lock(&mu_);
  const bool rated = rate_.min_bytes_per_second > 0;
  while (!done_) {
    const Duration idle = touched_ ? idle_ : handshake_;
    TimePoint wake = std::min(deadline_, last_ + idle);
    if (rated && touched_) wake = std::min(wake, std::chrono::system_clock::now() + kRateLook);
    cv_.WaitWithDeadline(&mu_, absl::FromChrono(wake));
    if (done_) break;
    const TimePoint now = std::chrono::system_clock::now();
    if (busy_) last_ = now;  // this node's own work is not the source idling
    const Duration bound = touched_ ? idle_ : handshake_;
    // Bytes owed: the minimum rate over the time waited, past the grace.
    const double owed = rate_.min_bytes_per_second *
                        std::chrono::duration<double>(Waited(now) - rate_.grace).count();
    const bool slow = rated && touched_ && static_cast<double>(received_) < owed;
    if (now >= deadline_ || now >= last_ + bound || slow) {
      waited_ = Waited(now);
      fired_ = Firing{
          .bound = now >= deadline_       ? "deadline"
                   : now >= last_ + bound ? (touched_ ? "idle" : "no_handshake")
                                          : "slow",
          .received_bytes = received_,
          .waited_seconds = std::chrono::duration<double>(waited_).count(),
      };
      if (hook_) hook_(*fired_);
      cancel_();
      break;
    }
  }
}

ReceiveWatchdog::~ReceiveWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    done_ = true;
    cv_.Signal();
  }
  thread_.join();
}

void ReceiveWatchdog::Touch() {
  absl::MutexLock lock(&mu_);
  const TimePoint now = std::chrono::system_clock::now();
  waited_ = Waited(now);
  last_ = now;
  busy_ = false;
  // The handshake came: the thread, asleep until the handshake bound, now looks at the rate.
  if (!touched_ && rate_.min_bytes_per_second > 0) cv_.Signal();
  touched_ = true;
}

void ReceiveWatchdog::Busy(int64_t arrived) {
  absl::MutexLock lock(&mu_);
  const TimePoint now = std::chrono::system_clock::now();
  waited_ = Waited(now);
  last_ = now;
  received_ += arrived;
  busy_ = true;
}

void ReceiveWatchdog::OnFire(Hook hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

std::optional<ReceiveWatchdog::Firing> ReceiveWatchdog::fired() {
  absl::MutexLock lock(&mu_);
  return fired_;
}

bool ReceiveWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  if (fired_) return false;
  done_ = true;
  cv_.Signal();
  return true;
}

}  // namespace riskkv
