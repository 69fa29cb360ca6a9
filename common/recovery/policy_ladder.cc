// A retention policy's rungs and their lower convex hull (see policy_ladder.h).
#include "common/recovery/policy_ladder.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace riskkv {

namespace {

WireForm PointForm(const RetentionPolicy::PathPoint& pt) {
  return ParseWireForm(pt.wire_form).value_or(WireForm::kPlain);
}

}  // namespace

std::vector<Rung> PolicyRungs(const RetentionPolicy& policy) {
  std::vector<Rung> rungs;
  std::set<std::pair<WireForm, int32_t>> seen;
  auto add = [&](const Rung& r) {
    if (seen.insert({r.form, r.groups}).second) rungs.push_back(r);
  };
  add(Rung{});  // exact FULL_KV
  // The policy's own configuration.
  const WireForm own_form = PolicyWireForm(policy);
  const auto own_groups = static_cast<int32_t>(policy.rebuilt_groups.size());
  Rung own{.form = own_form,
           .groups = own_groups,
           .sent_fraction = policy.kv_bytes_per_token > 0
                                ? 1.0 - static_cast<double>(policy.kv_bytes_saved_per_token) /
                                            static_cast<double>(policy.kv_bytes_per_token)
                                : 1.0,
           .delta_nll = policy.test_delta_nll};
  for (size_t i = 0; i < policy.path.size(); ++i) {
    const RetentionPolicy::PathPoint& pt = policy.path[i];
    if (PointForm(pt) == own_form && pt.groups == own_groups) {
      own.sent_fraction = pt.kv_sent_fraction;
      own.delta_nll = pt.delta_nll;
      own.path_index = static_cast<int32_t>(i);
    }
  }
  if (own_form != WireForm::kPlain || own_groups > 0) add(own);
  for (size_t i = 0; i < policy.path.size(); ++i) {
    const RetentionPolicy::PathPoint& pt = policy.path[i];
    if (!pt.in_bank) continue;
    add(Rung{.form = PointForm(pt),
             .groups = pt.groups,
             .sent_fraction = pt.kv_sent_fraction,
             .delta_nll = pt.delta_nll,
             .path_index = static_cast<int32_t>(i)});
  }
  std::stable_sort(rungs.begin(), rungs.end(), [](const Rung& a, const Rung& b) {
    if (a.sent_fraction != b.sent_fraction) return a.sent_fraction < b.sent_fraction;
    return a.delta_nll.mean > b.delta_nll.mean;
  });
  return rungs;
}

std::vector<Rung> LowerHull(std::vector<Rung> rungs) {
  std::stable_sort(rungs.begin(), rungs.end(), [](const Rung& a, const Rung& b) {
    if (a.sent_fraction != b.sent_fraction) return a.sent_fraction < b.sent_fraction;
    return a.delta_nll.mean < b.delta_nll.mean;
  });
  // Pareto front first: more bytes must buy strictly less damage.
  std::vector<Rung> front;
  for (const Rung& r : rungs) {
    if (!front.empty() && (r.sent_fraction == front.back().sent_fraction ||
                           r.delta_nll.mean >= front.back().delta_nll.mean)) {
      continue;
    }
    front.push_back(r);
  }
  // Then the convex chain (Andrew's monotone chain, lower half): a rung above the segment of its
  // neighbours is never the best use of its bytes. One on it (within rounding) stays: the same
  // damage per byte, in finer steps.
  std::vector<Rung> hull;
  auto cross = [](const Rung& o, const Rung& a, const Rung& b) {
    return (a.sent_fraction - o.sent_fraction) * (b.delta_nll.mean - o.delta_nll.mean) -
           (a.delta_nll.mean - o.delta_nll.mean) * (b.sent_fraction - o.sent_fraction);
  };
  for (const Rung& r : front) {
    while (hull.size() >= 2 && cross(hull[hull.size() - 2], hull.back(), r) < -1e-12) {
      hull.pop_back();
    }
    hull.push_back(r);
  }
  return hull;
}

absl::StatusOr<RetentionPolicy> PolicyAtRung(const RetentionPolicy& policy, WireForm form,
                                             int32_t groups) {
  const std::vector<Rung> rungs = PolicyRungs(policy);
  const auto it = std::find_if(rungs.begin(), rungs.end(),
                               [&](const Rung& r) { return r.form == form && r.groups == groups; });
  if (it == rungs.end()) {
    std::vector<std::string> names;
    for (const Rung& r : rungs) names.push_back(RungName(r));
    return absl::NotFoundError(absl::StrCat(std::string(WireFormName(form)), " k=", groups,
                                            " is not a rung of policy ", policy.Name(), " (",
                                            absl::StrJoin(names, "; "), ")"));
  }
  return PolicyAtRung(policy, *it);
}

RetentionPolicy PolicyAtRung(const RetentionPolicy& policy, const Rung& rung) {
  RetentionPolicy at = policy;
  at.wire_form = std::string(WireFormName(rung.form));
  if (rung.form == PolicyWireForm(policy) &&
      rung.groups == static_cast<int32_t>(policy.rebuilt_groups.size())) {
    return at;  // its own configuration, layers as it names them
  }
  at.rebuilt_groups.clear();
  for (int32_t g = 0; g < rung.groups; ++g) {
    at.rebuilt_groups.push_back(policy.singleton_risks[g].group);
  }
  std::sort(at.rebuilt_groups.begin(), at.rebuilt_groups.end(),
            [](const LayerGroup& a, const LayerGroup& b) { return a.targets < b.targets; });
  // Validate made kept and rebuilt layers partition the model's.
  auto n_layers = static_cast<int32_t>(policy.kept_layers.size());
  for (const LayerGroup& g : policy.rebuilt_groups) {
    n_layers += static_cast<int32_t>(g.targets.size());
  }
  std::vector<bool> rebuilt(n_layers, false);
  for (const LayerGroup& g : at.rebuilt_groups) {
    for (int32_t l : g.targets) rebuilt[l] = true;
  }
  at.kept_layers.clear();
  for (int32_t l = 0; l < n_layers; ++l) {
    if (!rebuilt[l]) at.kept_layers.push_back(l);
  }
  at.kv_bytes_saved_per_token = std::clamp<int64_t>(
      std::llround(static_cast<double>(policy.kv_bytes_per_token) * (1.0 - rung.sent_fraction)), 0,
      policy.kv_bytes_per_token);
  return at;
}

std::string RungName(const Rung& rung) {
  return absl::StrFormat("%s k=%d (%.1f%% of the KV, dNLL %+.4f)", WireFormName(rung.form),
                         rung.groups, 100.0 * rung.sent_fraction, rung.delta_nll.mean);
}

}  // namespace riskkv
