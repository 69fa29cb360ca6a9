// A retention policy's ladder: the configurations a node can migrate a session at under it, each
// with the bytes it sends and the damage the calibration measured, and the policy as a migration
// at one of them applies it.
//
// A rung rebuilds the first `groups` groups of the policy's risk ranking (singleton_risks) and
// sends the other layers in `form`. The rungs are exact FULL_KV, the policy's own configuration,
// and every path point the calibration marked in_bank (the bank holds the predictors and
// transforms it was measured with).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcodec/wire_form.h"
#include "common/recovery/retention_policy.h"

namespace riskkv {

struct Rung {
  WireForm form = WireForm::kPlain;
  int32_t groups = 0;          // the first `groups` ranked groups rebuilt
  double sent_fraction = 1.0;  // KV bytes sent, as a share of every layer's KV in the KV dtype
  RetentionPolicy::DeltaNll delta_nll;  // as measured on the calibration's selection requests
  int32_t path_index = -1;              // into policy.path; -1: not on the path

  bool operator==(const Rung&) const = default;
};

// Every rung of a policy that passed Validate, one per (form, groups), by ascending sent_fraction
// (then descending damage): exact FULL_KV (plain, nothing rebuilt, sent_fraction 1, no damage),
// the policy's own configuration (its path point's figures, or its test figures when its path
// lacks it) and every in_bank path point.
std::vector<Rung> PolicyRungs(const RetentionPolicy& policy);

// The rungs on the lower convex hull of mean ΔNLL against sent_fraction, from the fewest bytes to
// the least damage: each costs more bytes than the one before and buys strictly less damage, at
// a rate that never rises (what a water-filling allocation walks; rungs on a segment of the hull
// stay). `rungs` in any order.
std::vector<Rung> LowerHull(std::vector<Rung> rungs);

// The policy as a migration at rung (form, groups) applies it: that rung's kept and rebuilt
// layers and wire form, everything else the policy's (id, version, bank, transform step).
// NotFound naming the ladder when (form, groups) is none of PolicyRungs.
absl::StatusOr<RetentionPolicy> PolicyAtRung(const RetentionPolicy& policy, WireForm form,
                                             int32_t groups);
// The same for a rung PolicyRungs(policy) listed.
RetentionPolicy PolicyAtRung(const RetentionPolicy& policy, const Rung& rung);

// "int4 k=3 (12.4% of the KV, ΔNLL +0.0021)" for messages and tables.
std::string RungName(const Rung& rung);

}  // namespace riskkv
