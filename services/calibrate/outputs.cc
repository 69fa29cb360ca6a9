// What riskkv-calibrate hands on: the chosen configuration's predictor bank and retention policy,
// and the files of WriteOutputs.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/base/atomic_file.h"
#include "common/base/status_macros.h"
#include "common/recovery/retention_policy.h"
#include "services/calibrate/calibrate.h"
#include "services/calibrate/report.h"

namespace riskkv {

absl::StatusOr<std::unique_ptr<PredictorBank>> MakeChosenBank(const CalibrationResult& res) {
  // Exact KV, or a quantized form without reconstruction: nothing to rebuild. The transform form
  // needs its transforms all the same.
  const bool transform = res.chosen >= 0 && res.path[res.chosen].form == WireForm::kTransform;
  if (res.chosen < 0 || (res.path[res.chosen].groups.empty() && !transform)) {
    return std::unique_ptr<PredictorBank>();
  }
  std::vector<GroupFit> fits;
  for (const LayerGroup& g : res.ChosenGroups()) {
    for (const GroupFit& f : res.FitsFor(res.path[res.chosen].form)) {
      if (f.group == g) fits.push_back(f);
    }
  }
  return PredictorBank::FromFits(res.fingerprint, res.options.bank_dtype, fits,
                                 transform ? &res.transforms->transforms : nullptr);
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
  ASSIGN_OR_RETURN(auto bank, MakeChosenBank(res));
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
