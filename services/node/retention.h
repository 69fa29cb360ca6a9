// What a node needs for RECONSTRUCT: a retention policy and the predictor bank it names, checked
// against the node's model and against each other. Nodes swap the whole pair at once (a new
// version from the control plane), so migrations hold a snapshot for their duration.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/recovery/predictor_bank.h"
#include "riskkv/v1/retention_policy.pb.h"

namespace riskkv {

struct Retention {
  v1::RetentionPolicy policy;
  std::shared_ptr<const PredictorBank> bank;  // null when the policy rebuilds nothing
  // The bank prepared for the node's engine (set by NodeService::SetRetention).
  std::shared_ptr<const EnginePredictors> predictors;
};

// Checks the policy against a model of `n_layers` layers with `fingerprint` (FailedPrecondition
// for another model, InvalidArgument for a malformed policy) and the bank against the policy:
// the same content hash, and a predictor for each rebuilt group exactly as the policy names it.
// A policy that rebuilds nothing (its gate fell back to exact KV) may come without a bank.
absl::StatusOr<std::shared_ptr<const Retention>> MakeRetention(
    v1::RetentionPolicy policy, std::shared_ptr<const PredictorBank> bank, int32_t n_layers,
    const std::string& fingerprint);

// Reads a policy file and a bank file (empty path: none) and checks them as MakeRetention does.
absl::StatusOr<std::shared_ptr<const Retention>> LoadRetention(const std::string& policy_path,
                                                               const std::string& bank_path,
                                                               int32_t n_layers,
                                                               const std::string& fingerprint);

}  // namespace riskkv
