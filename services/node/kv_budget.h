// The node-wide KV budget (--kv-budget): the bytes of KV rows that sessions hold and that
// receives in progress have announced or written, admitted against one limit. A call that would
// take the node past it is refused before it computes or stores anything, naming the budget; the
// session it was for stays as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace riskkv {

class KvBudget {
 public:
  enum class State { kSessions = 0, kReceiving = 1 };
  static const char* StateName(State s);

  // `limit_bytes` 0: no limit (the bytes are still counted). `bytes_per_row`: one token's K and
  // V over every layer in the node's KV dtype. `on_change` hears a state's new total (metrics);
  // may be null.
  KvBudget(int64_t limit_bytes, int64_t bytes_per_row,
           std::function<void(State, int64_t)> on_change = nullptr);
  KvBudget(const KvBudget&) = delete;
  KvBudget& operator=(const KvBudget&) = delete;

  // The rows one session or receive holds, charged to one state; returned when destroyed.
  class Charge {
   public:
    Charge() = default;
    Charge(Charge&& other) noexcept;
    Charge& operator=(Charge&& other) noexcept;
    ~Charge();
    // Grows the charge to `rows` (a smaller number changes nothing); ResourceExhausted, with the
    // charge unchanged, when the node's total would pass the limit.
    absl::Status GrowTo(int64_t rows);
    // Counts the rows under another state (a receive that became a session).
    void MoveTo(State state);
    int64_t rows() const { return rows_; }

   private:
    friend class KvBudget;
    Charge(KvBudget* budget, State state) : budget_(budget), state_(state) {}
    void Release();
    KvBudget* budget_ = nullptr;
    State state_ = State::kSessions;
    int64_t rows_ = 0;
  };

  Charge Open(State state) { return Charge(this, state); }
  int64_t used_bytes(State state) const;
  int64_t limit_bytes() const { return limit_bytes_; }
  int64_t bytes_per_row() const { return bytes_per_row_; }

 private:
  absl::Status Add(State state, int64_t bytes);
  void Sub(State state, int64_t bytes);

  const int64_t limit_bytes_, bytes_per_row_;
  const std::function<void(State, int64_t)> on_change_;
  mutable absl::Mutex mu_;
  int64_t used_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
};

// "2147483648", "512MiB", "2GiB", "1.5GB", "0": bytes, with an optional unit (B, KB/MB/GB/TB
// powers of 1000, KiB/MiB/GiB/TiB powers of 1024); InvalidArgument naming `flag` otherwise.
absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& text);

}  // namespace riskkv
