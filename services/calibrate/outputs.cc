// What riskkv-calibrate hands on: the retention policy with its ladder, the predictor bank of the
// ladder's rungs, and the files of WriteOutputs.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/base/atomic_file.h"
#include "common/base/status_macros.h"
#include "common/recovery/retention_policy.h"
#include "services/calibrate/calibrate.h"
#include "services/calibrate/report.h"

namespace riskkv {

namespace {

// The fits the bank holds: those of the chosen configuration's form (the exact anchors' when exact
// KV is chosen).
const std::vector<GroupFit>& BankFits(const CalibrationResult& res) {
  return res.FitsFor(res.chosen >= 0 ? res.path[res.chosen].form : WireForm::kPlain);
}

}  // namespace

bool InBank(const CalibrationResult& res, size_t k) {
  const PathPointResult& pt = res.path[k];
  if (!pt.on_selection()) return false;
  if (pt.form == WireForm::kTransform && !res.transforms) return false;
  return pt.groups.empty() || &res.FitsFor(pt.form) == &BankFits(res);
}

absl::StatusOr<std::unique_ptr<PredictorBank>> MakePolicyBank(const CalibrationResult& res) {
  // The rungs rebuild prefixes of one ranking: the longest holds every group the others do.
  size_t longest = 0;
  for (size_t k = 0; k < res.path.size(); ++k) {
    if (InBank(res, k)) longest = std::max(longest, res.path[k].groups.size());
  }
  const bool transforms = res.transforms.has_value();
  if (longest == 0 && !transforms) return std::unique_ptr<PredictorBank>();
  std::vector<int> ranked(res.ranking.begin(), res.ranking.begin() + static_cast<long>(longest));
  std::sort(ranked.begin(), ranked.end(), [&](int a, int b) {
    return res.groups[a].targets.front() < res.groups[b].targets.front();
  });
  std::vector<GroupFit> fits;
  for (int g : ranked) {
    for (const GroupFit& f : BankFits(res)) {
      if (f.group == res.groups[g]) fits.push_back(f);
    }
  }
  return PredictorBank::FromFits(res.fingerprint, res.options.bank_dtype, fits,
                                 transforms ? &res.transforms->transforms : nullptr);
}

RetentionPolicy MakePolicy(const CalibrationResult& res, const std::string& bank_sha256) {
  const CalibrateOptions& o = res.options;
  RetentionPolicy p;
  p.model_fingerprint = res.fingerprint;
  p.policy_id = o.policy_id;
  p.version = o.policy_version;
  p.epsilon = o.epsilon;
  p.gate = GateName(o.gate);
  auto delta = [](const Measured& m) {
    return RetentionPolicy::DeltaNll{m.ci95.mean, m.ci95.lo, m.ci95.hi,
                                     static_cast<int32_t>(m.deltas.size())};
  };
  p.rebuilt_groups = res.ChosenGroups();
  std::vector<bool> rebuilt(res.config.n_layers, false);
  for (const LayerGroup& g : p.rebuilt_groups) {
    for (int32_t l : g.targets) rebuilt[l] = true;
  }
  for (int32_t l = 0; l < res.config.n_layers; ++l) {
    if (!rebuilt[l]) p.kept_layers.push_back(l);
  }
  for (int g : res.ranking) p.singleton_risks.push_back({res.groups[g], delta(res.singleton[g])});
  const GateDecision& d = res.gates[static_cast<int>(o.gate)].decision;
  for (size_t k = 0; k < res.path.size(); ++k) {
    if (!res.path[k].on_selection()) continue;  // dominated, never measured
    RetentionPolicy::PathPoint pt;
    pt.groups = static_cast<int32_t>(res.path[k].groups.size());
    pt.kv_omitted_fraction = res.path[k].kv_fraction;
    pt.wire_form = std::string(WireFormName(res.path[k].form));
    pt.kv_sent_fraction = res.path[k].sent_fraction;
    pt.delta_nll = delta(res.path[k].validation);
    pt.in_bank = InBank(res, k);
    if (k < d.statistic.size()) {
      pt.gate_statistic = d.statistic[k];
      pt.passed = d.passed[k];
    }
    p.path.push_back(pt);
  }
  p.kv_bytes_per_token = res.kv_bytes_per_token;
  // Not sent: the rebuilt layers, and what the wire form saves on the others.
  const double sent = res.chosen >= 0 ? res.path[res.chosen].sent_fraction : 1.0;
  p.kv_bytes_saved_per_token = std::min(
      res.kv_bytes_per_token, static_cast<int64_t>(std::llround(
                                  static_cast<double>(res.kv_bytes_per_token) * (1.0 - sent))));
  p.wire_form =
      std::string(WireFormName(res.chosen >= 0 ? res.path[res.chosen].form : WireForm::kPlain));
  p.arithmetic = res.arithmetic;
  p.predictor_bank_sha256 = bank_sha256;
  p.test_delta_nll = delta(res.chosen >= 0 ? res.path[res.chosen].test : res.test_exact);
  p.history_tokens = static_cast<int32_t>(o.history);
  p.eval_tokens = static_cast<int32_t>(o.eval);
  p.kv_dtype = o.kv_dtype == DType::kF16 ? "f16" : "f32";
  if (res.transforms) {
    p.transform_step = o.transform_step;
    p.transform_bytes_per_token = res.transforms->bytes_per_token;
  }
  return p;
}

absl::Status CheckOutputDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError("cannot create --out " + dir + ": " + ec.message());
  const std::filesystem::path probe = std::filesystem::path(dir) / ".riskkv-calibrate-probe";
  if (absl::Status s = WriteFileAtomically(probe.string(), ""); !s.ok()) {
    return absl::FailedPreconditionError("cannot write into --out " + dir + ": " +
                                         std::string(s.message()));
  }
  std::filesystem::remove(probe, ec);
  return absl::OkStatus();
}

absl::Status WriteOutputs(const CalibrationResult& res, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError("cannot create " + dir + ": " + ec.message());
  const std::filesystem::path out(dir);
  ASSIGN_OR_RETURN(auto bank, MakePolicyBank(res));
  std::string hash;
  if (bank) {
    RETURN_IF_ERROR(bank->Write((out / "bank.rkvbank").string()));
    hash = bank->content_hash();
  } else {
    std::filesystem::remove(out / "bank.rkvbank", ec);
  }
  const RetentionPolicy policy = MakePolicy(res, hash);
  RETURN_IF_ERROR(policy.Validate(static_cast<int32_t>(res.config.n_layers)));
  RETURN_IF_ERROR(WritePolicy(policy, (out / "policy.pb").string()));
  auto write_text = [&](const std::string& name, const std::string& content) {
    return WriteFileAtomically((out / name).string(), content);
  };
  RETURN_IF_ERROR(write_text("policy.txt", PolicyToText(policy)));
  RETURN_IF_ERROR(write_text("report.html", RenderReport(res, policy, bank.get())));
  RETURN_IF_ERROR(write_text("calibration.json", ResultToJson(res, policy)));
  if (res.noise.empty()) std::filesystem::remove(out / "noise-control.svg", ec);
  for (const auto& [name, svg] : RenderCharts(res)) {
    RETURN_IF_ERROR(write_text(name + ".svg", svg));
  }
  return absl::OkStatus();
}

}  // namespace riskkv
