// AUTO's choice of migration mode: the modes ranked by estimated time to a target, from this
// node's measured prefill and rebuild speeds, the transfer rate seen toward each target and the
// speeds targets report in their handshake replies.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/migration/migration_mode.h"

namespace riskkv {

struct ModePlannerOptions {
  // Speeds assumed before any measurement (seconds per history token).
  double prefill_seconds_per_token = 3e-3;
  double rebuild_seconds_per_token = 1.5e-4;
  // Learn from measurements; false pins the values above.
  bool measure_speeds = true;
  // The sender's configured link rate (0: none; 1 Gbit/s is assumed until a transfer is seen).
  double link_bytes_per_second = 0;
};

// What AUTO needs to know of the session and the policy.
struct PlanInput {
  int64_t history_tokens = 0;  // tokens a replay prefills and a rebuild predicts
  // KV bytes each mode would send, in the wire form it would send them in (StreamKvBytes):
  // FULL_KV every layer in the request's form, RECONSTRUCT the kept layers in its policy's.
  int64_t full_kv_bytes = 0;
  int64_t reconstruct_bytes = -1;  // < 0: no policy, no RECONSTRUCT
  std::string target;              // the target's address
};

struct ModePlan {
  std::vector<MigrationMode> modes;  // fastest first
  std::string reason;                // the estimates and where each input came from
  double seconds = 0;                // the first mode's estimated time
};

class ModePlanner {
 public:
  explicit ModePlanner(ModePlannerOptions options);

  // Measurements, exponentially weighted (no-ops unless measure_speeds; short runs say little
  // and are ignored).
  void MeasurePrefill(double seconds, int64_t tokens) ABSL_LOCKS_EXCLUDED(mu_);
  void MeasureRebuild(double seconds, int64_t tokens) ABSL_LOCKS_EXCLUDED(mu_);
  // A transfer of `bytes` in `seconds` to `target`, and the speeds it reported (0: unmeasured).
  void MeasurePeer(const std::string& target, double bytes, double seconds,
                   double prefill_seconds_per_token, double rebuild_seconds_per_token)
      ABSL_LOCKS_EXCLUDED(mu_);

  // This node's own measurements for a source's planner (0: not measured yet).
  double measured_prefill_seconds_per_token() const ABSL_LOCKS_EXCLUDED(mu_);
  double measured_rebuild_seconds_per_token() const ABSL_LOCKS_EXCLUDED(mu_);

  ModePlan Rank(const PlanInput& input) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Peer {
    double bytes_per_second = 0;
    double prefill_seconds_per_token = 0;
    double rebuild_seconds_per_token = 0;
  };
  const ModePlannerOptions options_;
  mutable absl::Mutex mu_;
  double prefill_spt_ ABSL_GUARDED_BY(mu_);
  double rebuild_spt_ ABSL_GUARDED_BY(mu_);
  bool prefill_measured_ ABSL_GUARDED_BY(mu_) = false;
  bool rebuild_measured_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Peer> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace riskkv
