// The idle-session TTL (see session_reaper.h).
#include "services/node/session_reaper.h"

#include <algorithm>

namespace riskkv {

SessionReaper::SessionReaper(SessionTable& table, absl::Duration ttl,
                             std::function<void(const SessionTable::Expired&)> on_expired,
                             absl::Duration period)
    : table_(table),
      ttl_(ttl),
      period_(std::max(absl::Milliseconds(10), std::min(period, ttl / 4))),
      on_expired_(std::move(on_expired)),
      thread_([this] { Run(); }) {}

SessionReaper::~SessionReaper() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void SessionReaper::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) return;
    }
    for (const SessionTable::Expired& e : table_.ExpireIdle(absl::Now(), ttl_)) {
      if (on_expired_) on_expired_(e);
    }
  }
}

}  // namespace riskkv
