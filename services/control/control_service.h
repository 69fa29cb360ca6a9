// riskkv-control's gRPC service over a PolicyStore.
#pragma once

#include <grpcpp/grpcpp.h>

#include "riskkv/v1/control.grpc.pb.h"
#include "services/access/authorizer.h"
#include "services/control/control_metrics.h"
#include "services/control/policy_store.h"

namespace riskkv {

// Initial metadata the service sends as soon as it takes a Watch, so a watcher knows its stream
// is up before any version arrives.
inline constexpr char kWatchMetadataKey[] = "riskkv-watch";

class ControlService final : public v1::Control::Service {
 public:
  // `metrics` may be null (no metrics); `access` too (every caller an anonymous operator).
  explicit ControlService(PolicyStore& store, ControlMetrics* metrics = nullptr,
                          std::shared_ptr<AccessFile> access = nullptr);

  grpc::Status PutPolicy(grpc::ServerContext*, const v1::PutPolicyRequest*,
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
  // OK when the caller may do `action`; else its refusal, counted.
  grpc::Status Authorize(grpc::ServerContext* ctx, Action action) const;

  PolicyStore& store_;
  ControlMetrics* metrics_;
  const Authorizer access_;
};

}  // namespace riskkv
