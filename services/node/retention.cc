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
          name +
          (policy.rebuilt_groups.empty() ? " sends the transform form" : " rebuilds layers") +
          " and comes without its bank " + policy.predictor_bank_sha256);
    }
  } else if (bank->content_hash() != policy.predictor_bank_sha256) {
    return absl::InvalidArgumentError(name + " needs bank " + policy.predictor_bank_sha256 +
                                      ", got " + bank->content_hash());
  }
  for (const LayerGroup& g : policy.rebuilt_groups) {
    const FoldedGroup* fg = bank->FindGroupForLayer(g.targets.front());
    if (fg == nullptr || fg->group != g) {
      return absl::InvalidArgumentError(name + ": bank " + bank->content_hash() +
                                        " has no predictor for group " + g.ToString());
    }
    r->groups.push_back(fg);
  }
  if (PolicyWireForm(policy) == WireForm::kTransform) {
    const size_t n_layers = policy.kept_layers.size() + [&] {
      size_t n = 0;
      for (const LayerGroup& g : policy.rebuilt_groups) n += g.targets.size();
      return n;
    }();
    if (bank->transforms() == nullptr || bank->transforms()->layers.size() != n_layers) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " sends the transform form, and bank ", bank->content_hash(), " holds ",
          bank->transforms()
              ? absl::StrCat("transforms of ", bank->transforms()->layers.size(), " layers")
              : std::string("no transforms"),
          " for a model of ", n_layers));
    }
  }
  r->policy = std::move(policy);
  r->bank = std::move(bank);
  return std::shared_ptr<const Retention>(std::move(r));
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
