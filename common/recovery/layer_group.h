// Which layers RISK-KV may rebuild and from what: a group is a run of consecutive target layers
// whose KV is predicted from the exact KV of anchor layers on both sides.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace riskkv {

struct LayerGroup {
  std::vector<int32_t> targets;  // consecutive layers rebuilt together, ascending
  std::vector<int32_t> anchors;  // exact layers feeding the predictor: left side then right side

  // "L4-5 <- L3,L6"
  std::string ToString() const;
  bool operator==(const LayerGroup&) const = default;
};

// How candidate groups are laid over a model's layers.
struct GroupRule {
  int32_t group_size = 2;        // target layers per group
  int32_t anchors_per_side = 1;  // exact layers on each side
  bool keep_first = true;        // layer 0 is never rebuilt
  bool keep_last = true;         // the last layer is never rebuilt

  absl::Status Validate() const;
};

// Tiles the layers as [anchors][targets][anchors][targets]...: neighbouring groups share their
// anchors, so any subset of the candidates can be rebuilt together (no target is another group's
// anchor). A tail too short for a full group becomes a smaller group when it still has anchors on
// both sides.
absl::StatusOr<std::vector<LayerGroup>> CandidateGroups(int32_t n_layers, const GroupRule& rule);

// Checks an explicit list: targets consecutive and in range, anchors in range and not targets of
// any group in the list, no layer rebuilt twice, first/last kept when the rule says so.
absl::Status ValidateGroups(const std::vector<LayerGroup>& groups, int32_t n_layers,
                            const GroupRule& rule);

}  // namespace riskkv
