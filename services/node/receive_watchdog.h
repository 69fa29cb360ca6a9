// Cancels a Receive call at its deadline, when its handshake did not come within a short bound,
// when its source has sent nothing for an idle period, or when it sends slower than a minimum
// rate, so a stalled, vanished or trickling source cannot hold one of the node's receive slots.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace riskkv {

// A receive's minimum rate (see ReceiveWatchdog).
struct MinimumRate {
  double min_bytes_per_second = 0;  // 0: no minimum
  std::chrono::system_clock::duration grace{};
};

// The minimum rate: from the handshake on, the bytes received must keep up with `min_rate` bytes
// per second of the time the node spent waiting on the source (its own work, between Busy() and
// Touch(), does not count), less a grace period. The grace is at least twice the time one
// largest chunk takes at the minimum rate, so a source that keeps the rate is never cut off.
//
// Touch() and Busy() only take the lock: the thread wakes at most once a second to look, so the
// per-chunk path never wakes it.
class ReceiveWatchdog {
 public:
  using TimePoint = std::chrono::system_clock::time_point;
  using Duration = std::chrono::system_clock::duration;
  using Rate = MinimumRate;
  // What made it fire and what it had seen by then.
  struct Firing {
    std::string bound;           // "deadline", "no_handshake", "idle" or "slow"
    int64_t received_bytes = 0;  // from the handshake on
    double waited_seconds = 0;   // waiting on the source, this node's own work left out
  };
  using Hook = std::function<void(const Firing&)>;

  // `cancel` ends the call (ServerContext::TryCancel); it runs on the watchdog's thread. Until
  // the first Touch (the handshake arrived) the idle bound is `handshake` (or `idle`, if
  // shorter).
  ReceiveWatchdog(std::function<void()> cancel, TimePoint deadline, Duration idle,
                  Duration handshake, Rate rate = {});
  ~ReceiveWatchdog();

  // Waiting for the source from now: the idle clock starts again.
  void Touch() ABSL_LOCKS_EXCLUDED(mu_);
  // A frame of `arrived` bytes came in and this node works on it (checking, rebuilding,
  // prefilling): the idle and rate clocks stop until Touch().
  void Busy(int64_t arrived = 0) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `hook` when it fires, before it cancels the call, so whoever the source asks once its
  // stream broke already knows why. It runs on the watchdog's thread under its lock: it must not
  // call back into the watchdog. Replaces an earlier hook.
  void OnFire(Hook hook) ABSL_LOCKS_EXCLUDED(mu_);
  // Why it cancelled the call, or nullopt while it has not.
  std::optional<Firing> fired() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the watchdog; false when it fired first.
  bool Disarm() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  // The time waited on the source since the handshake, up to `now`.
  Duration Waited(TimePoint now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;
  const TimePoint deadline_;
  const Duration idle_, handshake_;
  const Rate rate_;
  TimePoint last_ ABSL_GUARDED_BY(mu_);
  Duration waited_ ABSL_GUARDED_BY(mu_){};  // up to `last_`, while not busy
  int64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  bool touched_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Firing> fired_ ABSL_GUARDED_BY(mu_);
  Hook hook_ ABSL_GUARDED_BY(mu_);
  const std::function<void()> cancel_;
  std::thread thread_;
};

}  // namespace riskkv
