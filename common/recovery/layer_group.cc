// Candidate groups and their validation.
#include "common/recovery/layer_group.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace riskkv {

std::string LayerGroup::ToString() const {
  std::string out = "L";
  if (!targets.empty()) {
    absl::StrAppend(&out, targets.front());
    if (targets.size() > 1) absl::StrAppend(&out, "-", targets.back());
  }
  return absl::StrCat(out, " <- L", absl::StrJoin(anchors, ",L"));
}

absl::Status GroupRule::Validate() const {
  if (group_size < 1 || group_size > 64) {
    return absl::InvalidArgumentError(absl::StrCat("group size ", group_size, " not in [1, 64]"));
  }
  if (anchors_per_side < 1 || anchors_per_side > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("anchors per side ", anchors_per_side, " not in [1, 8]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerGroup>> CandidateGroups(int32_t n_layers, const GroupRule& rule) {
  if (auto s = rule.Validate(); !s.ok()) return s;
  if (n_layers < 1) return absl::InvalidArgumentError("a model has at least one layer");
  std::vector<LayerGroup> groups;
  // Every group needs anchors on both sides, so the tiling never rebuilds layer 0 or the last
  // layer whatever keep_first/keep_last say; those flags matter for explicit lists.
  int32_t anchor0 = 0;  // the next group's left anchors start here (the previous group's right)
  for (;;) {
    const int32_t first = anchor0 + rule.anchors_per_side;
    const int32_t room = n_layers - rule.anchors_per_side - first;
    if (room < 1) break;
    const int32_t size = std::min(rule.group_size, room);
    LayerGroup g;
    for (int32_t l = anchor0; l < first; ++l) g.anchors.push_back(l);
    for (int32_t l = first; l < first + size; ++l) g.targets.push_back(l);
    for (int32_t l = first + size; l < first + size + rule.anchors_per_side; ++l) {
      g.anchors.push_back(l);
    }
    groups.push_back(std::move(g));
    anchor0 = first + size;
  }
  return groups;
}

absl::Status ValidateGroups(const std::vector<LayerGroup>& groups, int32_t n_layers,
                            const GroupRule& rule) {
  std::set<int32_t> rebuilt;
  for (const LayerGroup& g : groups) {
    if (g.targets.empty()) return absl::InvalidArgumentError("a group has no target layers");
    if (g.anchors.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("group ", g.ToString(), " has no anchors"));
    }
    for (size_t i = 0; i < g.targets.size(); ++i) {
      const int32_t l = g.targets[i];
      if (l < 0 || l >= n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g.ToString(), ": layer ", l, " outside [0, ", n_layers, ")"));
      }
      if (i > 0 && l != g.targets[i - 1] + 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g.ToString(), ": targets are not consecutive"));
      }
      if ((rule.keep_first && l == 0) || (rule.keep_last && l == n_layers - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g.ToString(), " rebuilds layer ", l, ", which is always kept"));
      }
      if (!rebuilt.insert(l).second) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, " is rebuilt by two groups"));
      }
    }
  }
  for (const LayerGroup& g : groups) {
    for (int32_t a : g.anchors) {
      if (a < 0 || a >= n_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g.ToString(), ": anchor ", a, " outside [0, ", n_layers, ")"));
      }
      if (rebuilt.count(a)) {
        return absl::InvalidArgumentError(
            absl::StrCat("group ", g.ToString(), ": anchor ", a,
                         " is also a target of a rebuilt group; anchors stay exact"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace riskkv
