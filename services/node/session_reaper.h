// Closes the sessions nobody used for longer than the node's TTL, so sessions that clients
// forget cannot fill the session table or hold their KV forever.
#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/node/session_table.h"

namespace riskkv {

class SessionReaper {
 public:
  // Looks every `period` (at most a quarter of `ttl`, at least 10 ms); `on_expired` hears each
  // session it closed (may be null).
  SessionReaper(SessionTable& table, absl::Duration ttl,
                std::function<void(const SessionTable::Expired&)> on_expired,
                absl::Duration period = absl::Seconds(1));
  ~SessionReaper();

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  SessionTable& table_;
  const absl::Duration ttl_, period_;
  const std::function<void(const SessionTable::Expired&)> on_expired_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace riskkv
