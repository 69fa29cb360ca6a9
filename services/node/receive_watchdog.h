// Cancels a Receive call at its deadline, when its handshake did not come within a short bound,
// or when its source has sent nothing for an idle period, so a stalled or vanished source cannot
// hold one of the node's receive slots.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace riskkv {

// Touch() and Busy() only take the lock: the thread wakes at most once per idle period to look,
// so the per-chunk path never wakes it.
class ReceiveWatchdog {
 public:
  using TimePoint = std::chrono::system_clock::time_point;
  // Until the first Touch (the handshake arrived) the idle bound is `handshake` (or `idle`, if
  // shorter).
  ReceiveWatchdog(grpc::ServerContext* ctx, TimePoint deadline,
                  std::chrono::system_clock::duration idle,
                  std::chrono::system_clock::duration handshake);
  ~ReceiveWatchdog();

  // Waiting for the source from now: the idle clock starts again.
  void Touch() ABSL_LOCKS_EXCLUDED(mu_);
  // This node is working (rebuilding, prefilling): the idle clock stops until Touch().
  void Busy() ABSL_LOCKS_EXCLUDED(mu_);
  // Why it cancelled the call ("deadline", "no_handshake" or "idle"), or empty.
  std::string fired() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the watchdog; false when it fired first.
  bool Disarm() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run(grpc::ServerContext* ctx) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  absl::CondVar cv_;
  const TimePoint deadline_;
  const std::chrono::system_clock::duration idle_, handshake_;
  TimePoint last_ ABSL_GUARDED_BY(mu_);
  bool touched_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::string fired_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace riskkv
