// A node following the control plane: it watches one policy id, fetches the bank each new
// version names (by content hash, verified before use), keeps both in a cache on disk and hands
// every accepted version to the node. The cache is what a node starts from, so it keeps serving
// RECONSTRUCT with the last policy it had while the control plane is down.
//   CACHE/policies/<policy_id>.pb     the last accepted version
//   CACHE/banks/<sha256>.rkvbank      banks, named by content hash
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "riskkv/v1/control.grpc.pb.h"
#include "services/access/client_token.h"
#include "services/control/control_service.h"
#include "services/node/node_metrics.h"
#include "services/node/retention.h"

namespace riskkv {

struct PolicyFollowerOptions {
  std::string control_address;
  std::string policy_id;
  std::string cache_dir;
  // The node's model: versions for another model are rejected.
  std::string model_fingerprint;
  int32_t n_layers = 0;
  // Reconnection delay after the control plane went away: doubles from min to max, with jitter.
  double min_backoff_seconds = 0.5;
  double max_backoff_seconds = 30;
  int64_t max_bank_bytes = int64_t{4} << 30;
  double bank_timeout_seconds = 900;                      // one bank download, whole
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::shared_ptr<TokenFile> token;                       // this node's bearer token (may be null)
};

class PolicyFollower {
 public:
  using Apply = std::function<void(std::shared_ptr<const Retention>)>;

  // InvalidArgument for an empty address, a policy id unfit for a file name, or backoffs out of
  // order; an error when the cache directory cannot be created. `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<PolicyFollower>> Create(PolicyFollowerOptions options,
                                                                Apply apply, NodeMetrics* metrics);
  ~PolicyFollower();  // Stop()
  PolicyFollower(const PolicyFollower&) = delete;
  PolicyFollower& operator=(const PolicyFollower&) = delete;

  // The version an earlier run cached, or null when the cache holds none. An error names the
  // cached file that does not load (for another model, corrupt, its bank missing); the caller
  // goes on without it and the Watch fetches the latest version afresh.
  absl::StatusOr<std::shared_ptr<const Retention>> LoadCache() ABSL_LOCKS_EXCLUDED(mu_, apply_mu_);
  // Starts watching in the background: every version newer than the one in use is checked,
  // cached and applied; a lost connection is retried with backoff, catching up on reconnection.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Cancels the Watch and any bank download and waits for the thread.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // The version in use: applied (its metric counted) or loaded from the cache.
  uint64_t version() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  PolicyFollower(PolicyFollowerOptions options, Apply apply, NodeMetrics* metrics);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Checks a pushed version (the one validation it gets), fetches its bank, caches both and
  // applies it. Unavailable (or DeadlineExceeded) when the control plane went away mid-way: the
  // caller reconnects.
  absl::Status Accept(v1::Control::Stub& stub, const v1::RetentionPolicy& policy)
      ABSL_LOCKS_EXCLUDED(mu_, apply_mu_);
  absl::StatusOr<std::shared_ptr<const PredictorBank>> Bank(v1::Control::Stub& stub,
                                                            const std::string& sha256);
  void PruneBanks(const std::string& keep);
  // Logs when the control plane's latest version is below the one in use (a reset store).
  void WarnIfStoreWasReset(v1::Control::Stub& stub);
  // Registers (or, with null, clears) a call Stop() cancels; false when stopping already.
  bool SetActive(grpc::ClientContext** slot, grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits `seconds` or until Stop(); false when stopping.
  bool Sleep(double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  std::string PolicyPath() const;
  std::string BankPath(const std::string& sha256) const;

  PolicyFollowerOptions options_;
  Apply apply_;
  NodeMetrics* metrics_;
  // Held from the check of a version to its publication in version_, so version() never names a
  // version before it was applied.
  absl::Mutex apply_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watch_ ABSL_GUARDED_BY(mu_) = nullptr;  // the Watch in progress
  grpc::ClientContext* fetch_ ABSL_GUARDED_BY(mu_) = nullptr;  // the bank download in progress
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // Assigned under mu_ only while !stopping_; Stop() touches it only after setting stopping_, when
  // nothing assigns it any more, so it joins without holding mu_ (which Run() takes).
  std::thread thread_;
};

}  // namespace riskkv
