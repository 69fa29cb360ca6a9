// The one conversion between RetentionPolicy and its stored and wire form,
// riskkv.v1.RetentionPolicy. Readers validate here, once, so a RetentionPolicy that came from a
// file, the control plane or a node's cache needs no further checks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/recovery/retention_policy.h"
#include "riskkv/v1/retention_policy.pb.h"

namespace riskkv {

// RetentionPolicy::Validate(n_layers) (InvalidArgument), then, when expected_fingerprint is
// non-empty, a policy for other weights is FailedPrecondition naming both fingerprints. n_layers
// 0 is for readers without a model (the control plane): the layers must then partition [0, n) for
// the n the policy's own layer ids imply, at most 4096.
absl::StatusOr<RetentionPolicy> PolicyFromProto(const v1::RetentionPolicy& proto, int32_t n_layers,
                                                const std::string& expected_fingerprint);

v1::RetentionPolicy PolicyToProto(const RetentionPolicy& policy);

// Serialized riskkv.v1.RetentionPolicy bytes, checked as PolicyFromProto does; bytes that do not
// parse are InvalidArgument.
absl::StatusOr<RetentionPolicy> ParsePolicy(std::string_view bytes, int32_t n_layers,
                                            const std::string& expected_fingerprint);

}  // namespace riskkv
