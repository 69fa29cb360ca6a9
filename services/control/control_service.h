// riskkv-control's gRPC service over a PolicyStore.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>

#include "riskkv/v1/control.grpc.pb.h"
#include "services/access/authorizer.h"
#include "services/control/control_metrics.h"
#include "services/control/policy_store.h"

namespace riskkv {

// Initial metadata the service sends as soon as it takes a Watch, so a watcher knows its stream
// is up before any version arrives.
inline constexpr char kWatchMetadataKey[] = "riskkv-watch";

// The largest piece of a bank PutPolicyStream takes.
inline constexpr size_t kMaxBankPieceBytes = 1 << 20;

class ControlService final : public v1::Control::Service {
 public:
  // `metrics` may be null (no metrics); `access` too (every caller an anonymous operator).
  // `max_concurrent_puts`: PutPolicy and PutPolicyStream calls served at once; more are refused
  // (RESOURCE_EXHAUSTED).
  explicit ControlService(PolicyStore& store, ControlMetrics* metrics = nullptr,
                          std::shared_ptr<AccessFile> access = nullptr,
                          int max_concurrent_puts = 2);

  grpc::Status PutPolicy(grpc::ServerContext*, const v1::PutPolicyRequest*,
                         v1::PolicyRecord*) override;
  grpc::Status PutPolicyStream(grpc::ServerContext*, grpc::ServerReader<v1::PutPolicyPart>*,
                               v1::PolicyRecord*) override;
  grpc::Status GetPolicy(grpc::ServerContext*, const v1::GetPolicyRequest*,
                         v1::PolicyRecord*) override;
  grpc::Status ListPolicies(grpc::ServerContext*, const v1::ListPoliciesRequest*,
                            v1::ListPoliciesReply*) override;
  grpc::Status GetBank(grpc::ServerContext*, const v1::GetBankRequest*,
                       grpc::ServerWriter<v1::BankChunk>*) override;
  grpc::Status Watch(grpc::ServerContext*, const v1::WatchRequest*,
                     grpc::ServerWriter<v1::PolicyRecord>*) override;

 private:
  void CountPolicies();
  // Takes one of the concurrent put slots (Release gives it back); ResourceExhausted when none
  // is free.
  absl::Status TakePutSlot();
  void ReleasePutSlot() { puts_.fetch_sub(1); }
  // A put's end: counted by outcome, its record in `reply` when stored.
  grpc::Status Stored(const absl::StatusOr<RetentionPolicy>& p, v1::PolicyRecord* reply);
  // OK when the caller may do `action`; else its refusal, counted.
  grpc::Status Authorize(grpc::ServerContext* ctx, Action action) const;

  PolicyStore& store_;
  ControlMetrics* metrics_;
  const Authorizer access_;
  const int max_puts_;
  std::atomic<int> puts_{0};
};

}  // namespace riskkv
