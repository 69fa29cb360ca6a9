// The receive watchdog (see receive_watchdog.h).
#include "services/node/receive_watchdog.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace riskkv {

ReceiveWatchdog::ReceiveWatchdog(grpc::ServerContext* ctx, TimePoint deadline,
                                 std::chrono::system_clock::duration idle,
                                 std::chrono::system_clock::duration handshake)
    : deadline_(deadline),
      idle_(idle),
      handshake_(std::min(idle, handshake)),
      last_(std::chrono::system_clock::now()) {
  thread_ = std::thread([this, ctx] { Run(ctx); });
}

void ReceiveWatchdog::Run(grpc::ServerContext* ctx) {
  absl::MutexLock lock(&mu_);
  while (!done_) {
    const std::chrono::system_clock::duration idle = touched_ ? idle_ : handshake_;
    cv_.WaitWithDeadline(&mu_, absl::FromChrono(std::min(deadline_, last_ + idle)));
    if (done_) break;
    const TimePoint now = std::chrono::system_clock::now();
    if (busy_) last_ = now;  // this node's own work is not the source idling
    const std::chrono::system_clock::duration bound = touched_ ? idle_ : handshake_;
    if (now >= deadline_ || now >= last_ + bound) {
      fired_ = now >= deadline_ ? "deadline" : touched_ ? "idle" : "no_handshake";
      ctx->TryCancel();
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
  last_ = std::chrono::system_clock::now();
  busy_ = false;
  touched_ = true;
}

void ReceiveWatchdog::Busy() {
  absl::MutexLock lock(&mu_);
  busy_ = true;
}

std::string ReceiveWatchdog::fired() {
  absl::MutexLock lock(&mu_);
  return fired_;
}

bool ReceiveWatchdog::Disarm() {
  absl::MutexLock lock(&mu_);
  if (!fired_.empty()) return false;
  done_ = true;
  cv_.Signal();
  return true;
}

}  // namespace riskkv
