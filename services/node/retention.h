// What a node needs for RECONSTRUCT: a retention policy and the predictor bank it names, checked
// against each other once, when the pair is made. Nodes swap the whole pair at once (a new
// version from the control plane), so migrations hold a snapshot for their duration.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/recovery/policy_ladder.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"

namespace riskkv {

// One rung of the policy's ladder as a migration runs it.
struct RetentionRung {
  Rung rung;
  // PolicyAtRung, without the path and the ranking: a migration needs the rung's layers, form
  // and ids, not the measurements.
  RetentionPolicy policy;
  // The bank's predictor for each of policy's rebuilt groups, in its order.
  std::vector<const FoldedGroup*> groups;
};

struct Retention {
  RetentionPolicy policy;
  std::shared_ptr<const PredictorBank> bank;  // null when the policy needs none (PolicyNeedsBank)
  // The bank's predictor for each of policy.rebuilt_groups, in the policy's order, pointing into
  // `bank`: matched once, by MakeRetention, so migrations never look them up again.
  std::vector<const FoldedGroup*> groups;
  // The bank prepared for the node's engine (set by NodeService::SetRetention).
  std::shared_ptr<const EnginePredictors> predictors;
  // Every rung of the policy's ladder (PolicyRungs), its own configuration among them.
  std::vector<RetentionRung> rungs;

  // The rung (form, groups), or NotFound naming the ladder.
  absl::StatusOr<const RetentionRung*> FindRung(WireForm form, int32_t groups) const;
};

// Pairs a policy, validated for the node's model when it was read (ReadPolicy, PolicyFromProto),
// with its bank: the same content hash, and for every rung of its ladder (its own configuration
// among them) a predictor for each rebuilt group exactly as the rung names it and, for a rung in
// the transform form, the transforms of every layer (InvalidArgument otherwise). A policy that
// needs no bank (PolicyNeedsBank) may come without one.
absl::StatusOr<std::shared_ptr<const Retention>> MakeRetention(
    RetentionPolicy policy, std::shared_ptr<const PredictorBank> bank);

// Reads a policy file for a model of `n_layers` layers with `fingerprint` (FailedPrecondition for
// another model, InvalidArgument for a malformed policy) and a bank file (empty path: none), and
// pairs them as MakeRetention does.
absl::StatusOr<std::shared_ptr<const Retention>> LoadRetention(const std::string& policy_path,
                                                               const std::string& bank_path,
                                                               int32_t n_layers,
                                                               const std::string& fingerprint);

}  // namespace riskkv
