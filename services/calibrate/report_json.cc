// The calibration's figures as JSON, for scripts: the same numbers as the HTML report, at full
// precision.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/recovery/policy_ladder.h"
#include "services/calibrate/report.h"
#include "services/calibrate/report_format.h"

namespace riskkv {

using report::DeltaPplPercent;
using report::Ppl;

std::string ResultToJson(const CalibrationResult& r, const RetentionPolicy& policy) {
  using nlohmann::json;
  auto summary = [](const DeltaSummary& m) {
    return json{{"mean", m.ci95.mean},
                {"ci_low", m.ci95.lo},
                {"ci_high", m.ci95.hi},
                {"upper90", m.upper90},
                {"exact_nll", m.exact_nll},
                {"rebuilt_nll", m.rebuilt_nll},
                {"violations", m.violations},
                {"requests", m.requests},
                {"delta_ppl_percent", DeltaPplPercent(m)}};
  };
  // Over all requests, and by kind of text under "by_kind".
  auto measured = [&](const Measured& m) {
    json j = summary(m);
    if (!m.kl.empty()) {
      j["kl"] = m.MeanKl();
      j["top1"] = m.MeanTop1();
    }
    for (size_t k = 0; k < m.by_kind.size() && k < r.kinds.size(); ++k) {
      j["by_kind"][r.kinds[k].kind.name] = summary(m.by_kind[k]);
    }
    return j;
  };
  const CalibrateOptions& o = r.options;
  json j;
  j["model"] = {{"path", r.model_path},
                {"name", r.config.name},
                {"fingerprint", r.fingerprint},
                {"layers", r.config.n_layers}};
  j["corpus"] = {{"documents", r.corpus.documents}, {"dropped", r.corpus.dropped}};
  for (const KindStats& ks : r.kinds) {
    json kind = {{"name", ks.kind.name},
                 {"path", ks.kind.path},
                 {"boundary", ks.kind.boundary},
                 {"documents", ks.corpus.documents},
                 {"dropped", ks.corpus.dropped}};
    for (int s = 0; s < 3; ++s) {
      const SplitStats& st = ks.splits[s];
      kind["splits"][SplitName(static_cast<Split>(s))] = {{"documents", st.documents},
                                                          {"documents_used", st.documents_used},
                                                          {"tokens", st.tokens},
                                                          {"requests", st.requests}};
    }
    j["corpus"]["kinds"].push_back(kind);
  }
  json corpus_option = json::array();
  for (const CorpusKind& k : o.corpus) corpus_option.push_back(k.name + "=" + k.path);
  j["options"] = {{"corpus", corpus_option},
                  {"history", o.history},
                  {"eval", o.eval},
                  {"train", o.train},
                  {"validation", o.validation},
                  {"confirm", o.confirm},
                  {"test", o.test},
                  {"epsilon", o.epsilon},
                  {"gate", GateName(o.gate)},
                  {"seed", o.seed},
                  {"test_points", o.test_every_point ? "all" : "chosen"},
                  {"path_points", o.path_every_point ? "all" : "needed"}};
  for (int s = 0; s < 3; ++s) {
    const SplitStats& st = r.splits[s];
    j["splits"][SplitName(static_cast<Split>(s))] = {{"documents", st.documents},
                                                     {"documents_used", st.documents_used},
                                                     {"tokens", st.tokens},
                                                     {"requests", st.requests}};
  }
  for (int g : r.ranking) {
    j["singleton"].push_back(
        {{"group", r.groups[g].ToString()}, {"validation", measured(r.singleton[g])}});
  }
  for (size_t k = 0; k < r.path.size(); ++k) {
    const PathPointResult& p = r.path[k];
    json pt = {{"groups", p.groups.size()},
               {"wire_form", std::string(WireFormName(p.form))},
               {"layers", p.layers},
               {"kv_fraction", p.kv_fraction},
               {"sent_fraction", p.sent_fraction}};
    if (p.on_selection()) pt["validation"] = measured(p.validation);
    if (p.on_test()) pt["test"] = measured(p.test);
    if (!p.confirm.deltas.empty()) pt["confirm"] = measured(p.confirm);
    for (const GateResult& g : r.gates) {
      if (g.decision.passed.size() <= k || !p.on_selection()) continue;
      pt["gates"][GateName(g.gate)] = {{"statistic", g.decision.statistic[k]},
                                       {"passed", static_cast<bool>(g.decision.passed[k])},
                                       {"worst_kind", r.kinds[g.decision.worst_kind[k]].kind.name}};
    }
    pt["rung"] = InBank(r, k);
    j["path"].push_back(pt);
  }
  // The policy's ladder (policy_ladder.h) and which of its rungs are on the lower convex hull;
  // path_index as everywhere in this file, into the path above (the policy's path holds only the
  // measured points).
  const std::vector<Rung> rungs = PolicyRungs(policy), hull = LowerHull(rungs);
  std::vector<int> measured_points;
  for (size_t k = 0; k < r.path.size(); ++k) {
    if (r.path[k].on_selection()) measured_points.push_back(static_cast<int>(k));
  }
  j["ladder"] = json::array();
  for (const Rung& rung : rungs) {
    j["ladder"].push_back(
        {{"wire_form", std::string(WireFormName(rung.form))},
         {"groups", rung.groups},
         {"sent_fraction", rung.sent_fraction},
         {"delta_nll",
          {{"mean", rung.delta_nll.mean},
           {"ci_low", rung.delta_nll.ci_low},
           {"ci_high", rung.delta_nll.ci_high},
           {"requests", rung.delta_nll.requests}}},
         {"path_index",
          rung.path_index >= 0 && rung.path_index < static_cast<int>(measured_points.size())
              ? measured_points[rung.path_index]
              : -1},
         {"hull", std::find(hull.begin(), hull.end(), rung) != hull.end()}});
  }
  for (const GateResult& g : r.gates) {
    if (!g.decision.passed.empty()) j["gates"][GateName(g.gate)] = g.decision.chosen;
  }
  if (r.transforms) {
    j["transform"] = {{"kind", std::string(TransformKindName(r.transforms->transforms.kind))},
                      {"step", r.options.transform_step},
                      {"bytes_per_token", r.transforms->bytes_per_token},
                      {"fitted_rows", r.transforms->rows},
                      {"measured_rows", r.transforms->byte_rows}};
  }
  j["chosen"] = {{"path_index", r.chosen},
                 {"kv_fraction", r.chosen >= 0 ? r.path[r.chosen].kv_fraction : 0.0},
                 {"sent_fraction", r.chosen >= 0 ? r.path[r.chosen].sent_fraction : 1.0},
                 {"wire_form", std::string(WireFormName(r.chosen >= 0 ? r.path[r.chosen].form
                                                                      : WireForm::kPlain))},
                 {"arithmetic", r.arithmetic},
                 {"fit_anchors", r.options.fit_on_wire ? "wire" : "exact"},
                 {"test", measured(r.chosen >= 0 ? r.path[r.chosen].test : r.test_exact)},
                 {"validation", r.chosen >= 0 ? measured(r.path[r.chosen].validation) : json()},
                 {"test_exact_ppl", Ppl(r.test_exact.exact_nll)}};
  for (const BudgetResult& b : r.budgets) {
    auto point = [&](int k) {
      const Measured& m = k >= 0 ? r.path[k].test : r.test_exact;
      return json{
          {"path_index", k},
          {"wire_form", std::string(WireFormName(k >= 0 ? r.path[k].form : WireForm::kPlain))},
          {"layers", k >= 0 ? r.path[k].layers : 0},
          {"sent_fraction", k >= 0 ? r.path[k].sent_fraction : 1.0},
          {"test", measured(m)}};
    };
    j["budgets"].push_back({{"epsilon", b.epsilon},
                            {"with_reconstruction", point(b.with_reconstruction)},
                            {"without_reconstruction", point(b.without_reconstruction)}});
  }
  for (const NoiseResult& n : r.noise) {
    j["noise"]["groups"].push_back({{"group", r.groups[n.group].ToString()},
                                    {"rebuilt_mean", n.rebuilt_mean},
                                    {"noise_mean", n.noise_mean},
                                    {"nrmse_k", n.nrmse_k},
                                    {"nrmse_v", n.nrmse_v}});
  }
  if (!r.noise.empty() && !std::isnan(r.noise_rank_correlation)) {
    j["noise"]["rank_correlation"] = r.noise_rank_correlation;
  }
  for (const ExhaustiveResult& e : r.exhaustive) {
    j["exhaustive"].push_back(
        {{"mask", e.mask}, {"layers", e.layers}, {"mean", e.mean}, {"upper90", e.upper90}});
  }
  for (size_t g = 0; g < r.storage.size(); ++g) {
    j["storage"].push_back({{"group", r.groups[g].ToString()},
                            {"unfolded_bytes", r.storage[g].unfolded_bytes},
                            {"folded_f32_bytes", r.storage[g].folded_f32_bytes},
                            {"folded_f16_bytes", r.storage[g].folded_f16_bytes}});
  }
  j["kv_bytes_per_token"] = policy.kv_bytes_per_token;
  j["kv_bytes_saved_per_token"] = policy.kv_bytes_saved_per_token;
  j["predictor_bank_sha256"] = policy.predictor_bank_sha256;
  for (const auto& [name, s] : r.phase_seconds) j["phase_seconds"][name] = s;
  return j.dump(2) + "\n";
}

}  // namespace riskkv
