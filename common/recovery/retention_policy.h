// Reading and writing retention policy files (riskkv.v1.RetentionPolicy, binary protobuf),
// with validation against the model they claim to describe. This module owns the format; the
// rest of the engine sees RetentionPolicy's plain accessors only.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/recovery/layer_group.h"
#include "riskkv/v1/retention_policy.pb.h"

namespace riskkv {

// Structural checks: format version, non-empty fingerprint and bank hash, a known gate,
// epsilon >= 0, kept + rebuilt layers partitioning [0, n_layers), groups valid (consecutive
// targets, anchors kept), saved bytes <= total bytes.
absl::Status ValidatePolicy(const v1::RetentionPolicy& policy, int32_t n_layers);

// ValidatePolicy (InvalidArgument), then, when expected_fingerprint is non-empty, a policy for
// other weights is FailedPrecondition naming both fingerprints.
absl::Status ValidatePolicyForModel(const v1::RetentionPolicy& policy, int32_t n_layers,
                                    const std::string& expected_fingerprint);

// A policy id names files and directories: 1-128 characters of [A-Za-z0-9._-], not starting
// with '.', '_' or '-'.
absl::Status ValidatePolicyId(const std::string& id);

absl::Status WritePolicy(const v1::RetentionPolicy& policy, const std::string& path);

// Reads and validates; a policy for other weights (fingerprint mismatch) is FailedPrecondition
// naming both fingerprints. Empty expected_fingerprint skips that check.
absl::StatusOr<v1::RetentionPolicy> ReadPolicy(const std::string& path, int32_t n_layers,
                                               const std::string& expected_fingerprint);

// Protobuf text format, for people.
std::string PolicyToText(const v1::RetentionPolicy& policy);

// The rebuilt groups as engine types.
std::vector<LayerGroup> RebuiltGroups(const v1::RetentionPolicy& policy);

}  // namespace riskkv
