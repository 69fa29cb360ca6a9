// Retention policy and bank pairs (see retention.h).
#include "services/node/retention.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/retention_policy.h"

namespace riskkv {

absl::StatusOr<std::shared_ptr<const Retention>> MakeRetention(
    RetentionPolicy policy, std::shared_ptr<const PredictorBank> bank) {
  const std::string name = "policy " + policy.Name();
  auto r = std::make_shared<Retention>();
  if (bank == nullptr) {
    if (PolicyNeedsBank(policy)) {
      return absl::InvalidArgumentError(
          name + " rebuilds layers or sends the transform form (itself or at a rung of its " +
          "ladder) and comes without its bank " + policy.predictor_bank_sha256);
    }
  } else if (bank->content_hash() != policy.predictor_bank_sha256) {
    return absl::InvalidArgumentError(name + " needs bank " + policy.predictor_bank_sha256 +
                                      ", got " + bank->content_hash());
  }
  const auto n_layers = static_cast<int32_t>(policy.kept_layers.size()) + [&] {
    int32_t n = 0;
    for (const LayerGroup& g : policy.rebuilt_groups) n += static_cast<int32_t>(g.targets.size());
    return n;
  }();
  const std::string hash = bank ? bank->content_hash() : std::string("(none)");
  for (const Rung& rung : PolicyRungs(policy)) {
    RetentionPolicy at = PolicyAtRung(policy, rung);
    // A migration needs the rung's layers, form and ids, not the measurements: each rung holds
    // no copy of the path and the ranking.
    at.path.clear();
    at.singleton_risks.clear();
    const std::string which = absl::StrCat(name, " at ", RungName(rung));
    RetentionRung rr{.rung = rung, .policy = std::move(at), .groups = {}};
    for (const LayerGroup& g : rr.policy.rebuilt_groups) {
      const FoldedGroup* fg = bank ? bank->FindGroupForLayer(g.targets.front()) : nullptr;
      if (fg == nullptr || fg->group != g) {
        return absl::InvalidArgumentError(
            absl::StrCat(which, ": bank ", hash, " has no predictor for group ", g.ToString()));
      }
      rr.groups.push_back(fg);
    }
    if (rung.form == WireForm::kTransform &&
        (bank == nullptr || bank->transforms() == nullptr ||
         bank->transforms()->layers.size() != static_cast<size_t>(n_layers))) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, " sends the transform form, and bank ", hash, " holds ",
          bank && bank->transforms()
              ? absl::StrCat("transforms of ", bank->transforms()->layers.size(), " layers")
              : std::string("no transforms"),
          " for a model of ", n_layers));
    }
    if (rung.form == PolicyWireForm(policy) &&
        rung.groups == static_cast<int32_t>(policy.rebuilt_groups.size())) {
      r->groups = rr.groups;
    }
    r->rungs.push_back(std::move(rr));
  }
  r->policy = std::move(policy);
  r->bank = std::move(bank);
  return std::shared_ptr<const Retention>(std::move(r));
}

absl::StatusOr<const RetentionRung*> Retention::FindRung(WireForm form, int32_t groups) const {
  for (const RetentionRung& r : rungs) {
    if (r.rung.form == form && r.rung.groups == groups) return &r;
  }
  const absl::StatusOr<RetentionPolicy> at = PolicyAtRung(policy, form, groups);
  if (!at.ok()) return at.status();  // NotFound, naming the ladder
  return absl::NotFoundError(absl::StrCat(std::string(WireFormName(form)), " k=", groups,
                                          " is not a rung of ", policy.Name()));
}

absl::StatusOr<std::shared_ptr<const Retention>> LoadRetention(const std::string& policy_path,
                                                               const std::string& bank_path,
                                                               int32_t n_layers,
                                                               const std::string& fingerprint) {
  ASSIGN_OR_RETURN(RetentionPolicy policy, ReadPolicy(policy_path, n_layers, fingerprint));
  std::unique_ptr<PredictorBank> bank;
  if (!bank_path.empty()) {
    ASSIGN_OR_RETURN(bank, PredictorBank::Open(bank_path, fingerprint));
  }
  auto r = MakeRetention(std::move(policy), std::move(bank));
  if (!r.ok()) {
    return absl::Status(r.status().code(), policy_path +
                                               (bank_path.empty() ? "" : " with " + bank_path) +
                                               ": " + std::string(r.status().message()));
  }
  return r;
}

}  // namespace riskkv
