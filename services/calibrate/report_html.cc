// The calibration report as one self-contained HTML page: the decision, the run, every table of
// the selection and its charts inline.
#include <algorithm>
#include <cmath>

#include "common/recovery/policy_ladder.h"
#include "services/calibrate/report.h"
#include "services/calibrate/report_format.h"

namespace riskkv {
namespace {

using report::DeltaPplPercent;
using report::Esc;
using report::F;
using report::Ppl;

std::string Ci(const DeltaSummary& m) {
  if (m.requests == 0) return "not scored";
  return F("%+.5f [%+.5f, %+.5f]", m.ci95.mean, m.ci95.lo, m.ci95.hi);
}
double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

const char* kPageStyle = R"(
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:0.5em 0;font-size:0.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}tr.chosen td{background:#fff3d6;font-weight:600}
.note{color:#555;font-size:0.9em}code{background:#f5f5f5;padding:0 3px}
)";

std::string GateMark(const CalibrationResult& r, Gate g, size_t k) {
  const GateDecision& d = r.gates[static_cast<int>(g)].decision;
  if (k >= d.passed.size() || !r.path[k].on_selection()) return "&ndash;";
  std::string s = d.passed[k] ? "pass" : "fail";
  if (d.chosen == static_cast<int>(k)) s = "<b>chosen</b>";
  return s;
}

// The best subset of the exhaustive search under `gate` (Mean or Upper-90) at `eps`: the most
// layers omitted, ties broken by the lower statistic. Returns -1 when none passes.
int BestSubset(const CalibrationResult& r, bool upper, double eps) {
  int best = -1;
  for (size_t i = 0; i < r.exhaustive.size(); ++i) {
    const ExhaustiveResult& e = r.exhaustive[i];
    const double stat = upper ? e.upper90 : e.mean;
    if (stat > eps) continue;
    if (best < 0 || e.layers > r.exhaustive[best].layers ||
        (e.layers == r.exhaustive[best].layers &&
         stat < (upper ? r.exhaustive[best].upper90 : r.exhaustive[best].mean))) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

int BestOnPath(const CalibrationResult& r, bool upper, double eps) {
  int best = -1;
  for (size_t k = 0; k < r.path.size(); ++k) {
    const Measured& m = r.path[k].validation;
    if (r.path[k].form == WireForm::kPlain && r.path[k].on_selection() &&
        (upper ? m.upper90 : m.ci95.mean) <= eps &&
        (best < 0 || r.path[k].layers > r.path[best].layers)) {
      best = static_cast<int>(k);
    }
  }
  return best;
}

std::string SubsetName(const CalibrationResult& r, uint32_t mask) {
  std::string s;
  for (size_t g = 0; g < r.groups.size(); ++g) {
    if (mask & (1u << g)) s += (s.empty() ? "" : ", ") + r.groups[g].ToString();
  }
  return s;
}

}  // namespace

std::string RenderReport(const CalibrationResult& r, const RetentionPolicy& policy,
                         const PredictorBank* bank) {
  const CalibrateOptions& o = r.options;
  const ModelConfig& c = r.config;
  std::string h =
      "<!DOCTYPE html><html><head><meta charset='utf-8'><title>riskkv calibration: " + Esc(c.name) +
      "</title><style>" + kPageStyle + "</style></head><body>";
  h += "<h1>RISK-KV calibration of " + Esc(c.name) + "</h1>";
  const Measured& chosen_test = r.chosen >= 0 ? r.path[r.chosen].test : r.test_exact;
  const double omitted = r.chosen >= 0 ? 100 * r.path[r.chosen].kv_fraction : 0.0;
  h += F("<p><b>Chosen:</b> %s gate at &#949; = %g: ", GateName(o.gate), o.epsilon);
  if (r.chosen >= 0) {
    h +=
        F("rebuild %d of %lld layers and send the others %s (%.1f%% of the KV omitted, %lld of "
          "%lld bytes per token not sent), measured in %s arithmetic, the predictors fitted on "
          "%s anchors. Held-out test: &#916;NLL %s, &#916;PPL %+.3f%%.</p>",
          r.path[r.chosen].layers, static_cast<long long>(c.n_layers),
          std::string(WireFormName(r.path[r.chosen].form)).c_str(), omitted,
          static_cast<long long>(policy.kv_bytes_saved_per_token),
          static_cast<long long>(policy.kv_bytes_per_token), r.arithmetic.c_str(),
          r.options.fit_on_wire && r.path[r.chosen].form != WireForm::kPlain ? "decoded" : "exact",
          Ci(chosen_test).c_str(), DeltaPplPercent(chosen_test));
  } else {
    h += "no configuration on the path passes; the policy keeps every layer exact.</p>";
  }

  h += "<h2>Run</h2><table>";
  auto row = [&](const std::string& k, const std::string& v) {
    h += "<tr><th class='l'>" + k + "</th><td class='l'>" + v + "</td></tr>";
  };
  row("model", Esc(r.model_path));
  row("fingerprint", "<code>" + Esc(r.fingerprint) + "</code>");
  row("layers, KV width",
      F("%lld, %lld", static_cast<long long>(c.n_layers), static_cast<long long>(c.kv_width())));
  row("corpus", F("%zu kind(s) of text, %lld documents; %lld dropped as not prose (min prose "
                  "share %g); each kind split by document on its own",
                  r.kinds.size(), static_cast<long long>(r.corpus.documents),
                  static_cast<long long>(r.corpus.dropped), o.min_prose));
  row("request", F("%lld history tokens (H) + %lld scored tokens (T)",
                   static_cast<long long>(o.history), static_cast<long long>(o.eval)));
  row("policy",
      Esc(policy.policy_id) + F(" version %llu", static_cast<unsigned long long>(policy.version)));
  row("bank", bank ? F("%s, %.3f MiB of maps, sha256 <code>", DTypeName(bank->dtype()),
                       Mib(bank->bytes())) +
                         bank->content_hash() + "</code>"
                   : std::string("none (nothing rebuilt)"));
  if (r.transforms) {
    row("transform form",
        F("%s transforms of every layer's keys and values, fitted to %lld moved rows of the "
          "training histories; step %g of each layer's RMS; %.1f bytes per layer and token "
          "(%.1f%% of f16), measured on %lld rows",
          std::string(TransformKindName(r.transforms->transforms.kind)).c_str(),
          static_cast<long long>(r.transforms->rows), o.transform_step,
          r.transforms->bytes_per_token,
          100.0 * r.transforms->bytes_per_token / (4.0 * static_cast<double>(c.kv_width())),
          static_cast<long long>(r.transforms->byte_rows)));
  }
  row("seed, bootstrap",
      F("%llu, %d resamples", static_cast<unsigned long long>(o.seed), o.bootstrap_resamples));
  h += "</table><table><tr><th class='l'>split</th><th>documents</th><th>documents "
       "read</th><th>tokens read</th><th>requests</th><th class='l'>used for</th></tr>";
  const char* uses[] = {"ridge fits",
                        "ridge strength, singleton risk, path, gates (+ confirmation requests)",
                        "held-out report only"};
  for (int s = 0; s < 3; ++s) {
    const SplitStats& st = r.splits[s];
    h +=
        F("<tr><td class='l'>%s</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%d</td><td "
          "class='l'>%s</td></tr>",
          SplitName(static_cast<Split>(s)), static_cast<long long>(st.documents),
          static_cast<long long>(st.documents_used), static_cast<long long>(st.tokens), st.requests,
          uses[s]);
  }
  h +=
      F("</table><p class='note'>Validation requests: %d for selection, %d for Stable-split "
        "confirmation.</p>",
        o.validation, o.confirm);
  h +=
      "<table><tr><th class='l'>kind</th><th class='l'>source</th><th class='l'>document "
      "boundary</th><th>documents</th><th>dropped</th><th>train docs / requests</th><th>validation "
      "docs / requests</th><th>test docs / requests</th></tr>";
  for (const KindStats& ks : r.kinds) {
    h += "<tr><td class='l'>" + Esc(ks.kind.name) + "</td><td class='l'>" + Esc(ks.kind.path) +
         "</td><td class='l'><code>" + Esc(ks.kind.boundary) + "</code></td>" +
         F("<td>%lld</td><td>%lld</td>", static_cast<long long>(ks.corpus.documents),
           static_cast<long long>(ks.corpus.dropped));
    for (int sp = 0; sp < 3; ++sp) {
      h += F("<td>%lld / %d</td>", static_cast<long long>(ks.splits[sp].documents),
             ks.splits[sp].requests);
    }
    h += "</tr>";
  }
  h += "</table>";

  const auto charts = RenderCharts(r);
  auto chart = [&](const char* name) {
    for (const auto& [n, svg] : charts) {
      if (n == name) return svg;
    }
    return std::string();
  };
  h += "<h2>Chosen configuration</h2>" + chart("layers");

  h += "<h2>Singleton risk per group (validation)</h2><p class='note'>Mean NLL increase of the "
       "evaluation tokens with one group rebuilt and every other layer exact, paired per request "
       "with exact KV; whiskers are 95% bootstrap intervals. Ranked least risky first.</p>";
  h += chart("singleton-risk");
  h += "<table><tr><th>rank</th><th class='l'>group</th><th>&#916;NLL mean [95% CI]</th><th>upper "
       "90%</th><th>requests &gt; &#949;</th></tr>";
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const int g = r.ranking[i];
    h += F("<tr><td>%zu</td><td class='l'>%s</td><td>%s</td><td>%+.5f</td><td>%d/%zu</td></tr>",
           i + 1, Esc(r.groups[g].ToString()).c_str(), Ci(r.singleton[g]).c_str(),
           r.singleton[g].upper90, r.singleton[g].violations, r.singleton[g].deltas.size());
  }
  h += "</table>";

  h += "<h2>Ordered path</h2><p class='note'>Point k rebuilds the k least risky groups together, "
       "each configuration measured for real. Validation selects; the test split is held out and "
       "only reported.</p>" +
       chart("ordered-path");

  h += "<h2>Table I: held-out test split</h2><p class='note'>Paired 95% bootstrap intervals over " +
       F("%zu", r.test_exact.deltas.size()) +
       " test requests. PPL = exp(mean NLL); &#916;PPL from the mean paired &#916;NLL; KL: mean "
       "KL(exact &#8214; configuration) of the next-token distribution over the scored tokens "
       "(the 64 likeliest tokens of the exact pass each on its own, the rest as one: a lower "
       "bound); top-1: the share of scored tokens whose likeliest token is exact KV's. Gate "
       "columns: the decision on validation data.</p>";
  h += "<table><tr><th>k</th><th class='l'>wire</th><th class='l'>group added</th><th>layers</th>"
       "<th>KV omitted</th><th>bytes sent</th><th>&#916;NLL mean [95% CI]</th><th>PPL "
       "exact</th><th>PPL "
       "rebuilt</th><th>&#916;PPL</th><th>KL</th><th>top-1</th><th>requests &gt; &#949;</th><th>"
       "val mean</th><th>val "
       "upper 90%</th><th>mean</th><th>upper90</th><th>stable-split</th></tr>";
  h +=
      F("<tr><td>0</td><td class='l'>plain</td><td class='l'>exact KV</td><td>0</td><td>0.0%%</"
        "td><td>100.0%%</td><td>0</td><td>%.4f</"
        "td><td>%.4f</td><td>0</td><td>0</td><td>100%%</td><td>0</td><td></td><td></td><td></"
        "td><td></td><td></td></tr>",
        Ppl(r.test_exact.exact_nll), Ppl(r.test_exact.exact_nll));
  for (size_t k = 0; k < r.path.size(); ++k) {
    const PathPointResult& p = r.path[k];
    const std::string test_cells =
        p.on_test()
            ? F("<td>%s</td><td>%.4f</td><td>%.4f</td><td>%+.3f%%</td><td>%.5f</td><td>%.2f%%</"
                "td><td>%d/%zu</td>",
                Ci(p.test).c_str(), Ppl(p.test.exact_nll), Ppl(p.test.rebuilt_nll),
                DeltaPplPercent(p.test), p.test.MeanKl(), 100 * p.test.MeanTop1(),
                p.test.violations, p.test.deltas.size())
            : "<td class='l' colspan='7'>not scored on the test split (--test-points all)</td>";
    h += F("<tr%s><td>%zu</td><td class='l'>%s</td><td class='l'>%s</td><td>%d</td><td>%.1f%%</"
           "td><td>%.1f%%</td>",
           static_cast<int>(k) == r.chosen ? " class='chosen'" : "", p.groups.size(),
           std::string(WireFormName(p.form)).c_str(),
           p.groups.empty() ? "none (FULL_KV)" : Esc(r.groups[p.groups.back()].ToString()).c_str(),
           p.layers, 100 * p.kv_fraction, 100 * p.sent_fraction) +
         test_cells +
         (p.on_selection()
              ? F("<td>%+.5f</td><td>%+.5f</td>", p.validation.ci95.mean, p.validation.upper90)
              : "<td class='l' colspan='2'>not measured: a point with fewer bytes passes "
                "(--path-points all)</td>");
    for (Gate g : {Gate::kMean, Gate::kUpper90, Gate::kStableSplit}) {
      h += "<td>" + GateMark(r, g, k) + "</td>";
    }
    h += "</tr>";
  }
  h += "</table>";

  h += "<h2>By kind of text</h2><p class='note'>Each kind's own requests: mean &#916;NLL with its "
       "95% bootstrap interval on the selection and the held-out test split, and the Upper-90 "
       "bound on the kind's selection requests. The gates compare the worst kind's statistic "
       "with &#949; (Upper-90: the largest of the kinds' Upper-90 bounds).</p>";
  h += "<table><tr><th>k</th><th class='l'>wire</th><th>layers</th><th class='l'>worst kind "
       "(upper90 gate)</th>";
  for (const KindStats& ks : r.kinds) {
    h += "<th>" + Esc(ks.kind.name) + " selection &#916;NLL [95% CI]</th><th>" + Esc(ks.kind.name) +
         " upper 90%</th><th>" + Esc(ks.kind.name) + " test &#916;NLL [95% CI]</th>";
  }
  h += "</tr>";
  const GateDecision& upper = r.gates[static_cast<int>(Gate::kUpper90)].decision;
  for (size_t k = 0; k < r.path.size(); ++k) {
    const PathPointResult& p = r.path[k];
    h += F("<tr%s><td>%zu</td><td class='l'>%s</td><td>%d</td><td class='l'>",
           static_cast<int>(k) == r.chosen ? " class='chosen'" : "", p.groups.size(),
           std::string(WireFormName(p.form)).c_str(), p.layers);
    if (k < upper.worst_kind.size() && p.on_selection()) {
      h += Esc(r.kinds[upper.worst_kind[k]].kind.name) + F(" %+.5f", upper.statistic[k]);
    }
    h += "</td>";
    for (size_t kind = 0; kind < r.kinds.size(); ++kind) {
      h += p.on_selection() ? "<td>" + Ci(p.validation.by_kind[kind]) + "</td>" +
                                  F("<td>%+.5f</td>", p.validation.by_kind[kind].upper90)
                            : std::string("<td class='l' colspan='2'>not measured</td>");
      h += "<td>" + (p.on_test() ? Ci(p.test.by_kind[kind]) : "not scored") + "</td>";
    }
    h += "</tr>";
  }
  h += "</table>";

  h += "<h2>Quality gates</h2><p class='note'>Each gate picks the configuration that sends the "
       "fewest bytes among those that pass on validation data (Stable-split also on the "
       "confirmation "
       "requests), or falls back to exact KV. Outcomes on the held-out test split.</p>";
  h += "<table><tr><th class='l'>gate</th><th class='l'>decision</th><th>KV omitted</th><th>test "
       "&#916;NLL [95% CI]</th><th>test &#916;PPL</th><th>test requests &gt; &#949;</th></tr>";
  for (const GateResult& g : r.gates) {
    if (g.decision.passed.empty()) {
      h +=
          F("<tr><td class='l'>%s</td><td class='l'>not run (no confirmation "
            "requests)</td><td></td><td></td><td></td><td></td></tr>",
            GateName(g.gate));
      continue;
    }
    const int k = g.decision.chosen;
    const Measured& m = k >= 0 ? r.path[k].test : r.test_exact;
    h +=
        F("<tr%s><td class='l'>%s</td><td class='l'>%s</td><td>%.1f%%</td><td>%s</td><td>%+.3f%%"
          "</td><td>%d/%zu</td></tr>",
          g.gate == o.gate ? " class='chosen'" : "", GateName(g.gate),
          k >= 0 ? F("%s, %zu groups", std::string(WireFormName(r.path[k].form)).c_str(),
                     r.path[k].groups.size())
                       .c_str()
                 : "exact KV (fallback)",
          k >= 0 ? 100 * r.path[k].kv_fraction : 0.0, Ci(m).c_str(), DeltaPplPercent(m),
          m.violations, m.deltas.size());
  }
  h += "</table>";

  if (!r.budgets.empty()) {
    h +=
        F("<h2>Bytes sent at each budget</h2><p class='note'>The %s gate's choice at each budget, "
          "from the same validation measurements: among every configuration, and among those "
          "that rebuild nothing (FULL_KV in a wire form), so the contribution of reconstruction "
          "shows. Bytes as a share of FULL_KV plain; outcomes on the held-out test split.</p>",
          GateName(o.gate));
    h += "<table><tr><th>&#949;</th><th class='l'>with reconstruction</th><th>bytes "
         "sent</th><th>test &#916;NLL [95% CI]</th><th>test &#916;PPL</th><th class='l'>without "
         "reconstruction</th><th>bytes sent</th><th>test &#916;NLL [95% CI]</th><th>test "
         "&#916;PPL</th></tr>";
    auto cells = [&](int k) {
      if (k < 0) {
        return F("<td class='l'>exact KV</td><td>100.0%%</td><td>%s</td><td>%+.3f%%</td>",
                 Ci(r.test_exact).c_str(), DeltaPplPercent(r.test_exact));
      }
      const PathPointResult& p = r.path[k];
      return F(
          "<td class='l'>%s, %d of %lld layers rebuilt</td><td>%.1f%%</td><td>%s</td><td>%+.3f%%"
          "</td>",
          std::string(WireFormName(p.form)).c_str(), p.layers, static_cast<long long>(c.n_layers),
          100 * p.sent_fraction, Ci(p.test).c_str(), DeltaPplPercent(p.test));
    };
    for (const BudgetResult& b : r.budgets) {
      h += F("<tr><td>%g</td>", b.epsilon) + cells(b.with_reconstruction) +
           cells(b.without_reconstruction) + "</tr>";
    }
    h += "</table>";
  }

  {
    // The ladder the policy carries, and its hull.
    const std::vector<Rung> rungs = PolicyRungs(policy), hull = LowerHull(rungs);
    h += "<h2>The policy's ladder</h2><p class='note'>The configurations a node can migrate a "
         "session at under this policy (<code>riskkvctl migrate --mode reconstruct "
         "--rebuilt-groups K --wire-form F</code>): exact FULL_KV, the chosen configuration and "
         "every measured point whose predictors and transforms the bank holds. Bytes as a share "
         "of FULL_KV plain; &#916;NLL on the selection requests (the chosen configuration's "
         "own point, or its test figures when the path lacks it). Rungs on the lower convex hull "
         "of &#916;NLL against bytes are what an allocation over many sessions picks from.</p>";
    h += "<table><tr><th class='l'>wire form</th><th>groups rebuilt</th><th>bytes "
         "sent</th><th>&#916;NLL [95% CI]</th><th class='l'>hull</th></tr>";
    for (const Rung& rung : rungs) {
      const bool on_hull = std::find(hull.begin(), hull.end(), rung) != hull.end();
      const bool own = rung.form == PolicyWireForm(policy) &&
                       rung.groups == static_cast<int32_t>(policy.rebuilt_groups.size());
      h +=
          F("<tr%s><td class='l'>%s</td><td>%d</td><td>%.1f%%</td><td>%+.5f [%+.5f, "
            "%+.5f]</td><td class='l'>%s</td></tr>",
            own ? " class='chosen'" : "", std::string(WireFormName(rung.form)).c_str(), rung.groups,
            100 * rung.sent_fraction, rung.delta_nll.mean, rung.delta_nll.ci_low,
            rung.delta_nll.ci_high, on_hull ? "on the hull" : "");
    }
    h += "</table>";
  }

  h += "<h2>Table III: predictor storage per group</h2>";
  double unf = 0, f32 = 0, f16 = 0;
  for (const StorageResult& s : r.storage) {
    unf += Mib(s.unfolded_bytes);
    f32 += Mib(s.folded_f32_bytes);
    f16 += Mib(s.folded_f16_bytes);
  }
  const double n = static_cast<double>(r.storage.size());
  h +=
      F("<table><tr><th class='l'></th><th>ridge to attention input (f32)</th><th>folded "
        "K/V maps (f32)</th><th>folded K/V maps (f16)</th></tr><tr><td class='l'>mean per "
        "group (MiB)</td><td>%.3f</td><td>%.3f</td><td>%.3f</td></tr><tr><td "
        "class='l'>relative</td><td>1</td><td>%.3f</td><td>%.3f</td></tr></table>",
        unf / n, f32 / n, f16 / n, f32 / unf, f16 / unf);
  h +=
      F("<p class='note'>Per target layer: ridge map [hidden %lld &times; F] plus intercept; "
        "folded maps 2 &times; [KV width %lld &times; F] plus two offsets, F = 2 &times; anchors "
        "&times; KV width. The policy's bank (every rung's groups) holds %.3f MiB of maps%s.</p>",
        static_cast<long long>(c.hidden), static_cast<long long>(c.kv_width()),
        bank ? Mib(bank->bytes()) : 0.0, bank ? "" : " (no bank: no rung rebuilds)");

  if (!r.noise.empty()) {
    h +=
        F("<h2>Control: Gaussian noise of matched NRMSE</h2><p class='note'>Each group's rebuilt "
          "K/V replaced by exact K/V plus isotropic Gaussian noise with the same per-request, "
          "per-layer NRMSE as the reconstruction (%d validation requests, %d draw(s)). Spearman "
          "rank correlation between the two risk orders over %zu groups: <b>%s</b>. A low value "
          "means noise sensitivity cannot stand in for measured reconstruction risk.</p>",
          o.noise_requests, o.noise_draws, r.noise.size(),
          std::isnan(r.noise_rank_correlation) ? "n/a (fewer than 3 groups)"
                                               : F("%.2f", r.noise_rank_correlation).c_str());
    h += chart("noise-control");
    h += "<table><tr><th class='l'>group</th><th>K NRMSE</th><th>V NRMSE</th><th>&#916;NLL "
         "rebuilt [95% CI]</th><th>&#916;NLL noise [95% CI]</th></tr>";
    for (int g : r.ranking) {
      const NoiseResult& nr = r.noise[g];
      h +=
          F("<tr><td class='l'>%s</td><td>%.4f</td><td>%.4f</td><td>%+.5f [%+.5f, %+.5f]</td>"
            "<td>%+.5f [%+.5f, %+.5f]</td></tr>",
            Esc(r.groups[g].ToString()).c_str(), nr.nrmse_k, nr.nrmse_v, nr.rebuilt_mean,
            nr.rebuilt_ci95.lo, nr.rebuilt_ci95.hi, nr.noise_mean, nr.noise_ci95.lo,
            nr.noise_ci95.hi);
    }
    h += "</table>";
  }

  if (!r.exhaustive.empty()) {
    h +=
        F("<h2>Exhaustive search</h2><p class='note'>All %zu non-empty subsets of the %zu "
          "candidates measured on the validation requests, against the %zu configurations of the "
          "ordered path (2G evaluations with the singletons).</p>",
          r.exhaustive.size(), r.groups.size(), r.path.size());
    h += "<table><tr><th>&#949;</th><th class='l'>gate</th><th>path: layers "
         "omitted</th><th>best subset: layers omitted</th><th class='l'>best subset</th></tr>";
    for (double mult : {0.25, 0.5, 1.0, 2.0, 4.0}) {
      const double eps = o.epsilon * mult;
      // The subsets rebuild from exact anchors: the plain path is what they compare with.
      const bool plain_path =
          std::any_of(r.path.begin(), r.path.end(),
                      [](const PathPointResult& p) { return p.form == WireForm::kPlain; });
      for (bool upper : {false, true}) {
        const int pk = BestOnPath(r, upper, eps), bs = BestSubset(r, upper, eps);
        h +=
            F("<tr><td>%g</td><td class='l'>%s</td><td>%s</td><td>%d</td><td class='l'>%s</td>"
              "</tr>",
              eps, upper ? "upper90" : "mean",
              plain_path ? F("%d", pk >= 0 ? r.path[pk].layers : 0).c_str()
                         : "not measured (--wire-forms without plain)",
              bs >= 0 ? r.exhaustive[bs].layers : 0,
              bs >= 0 ? Esc(SubsetName(r, r.exhaustive[bs].mask)).c_str() : "exact KV");
      }
    }
    h += "</table>";
  }

  h += "<h2>Time per phase</h2><table><tr><th class='l'>phase</th><th>seconds</th></tr>";
  double total = 0;
  for (const auto& [name, s] : r.phase_seconds) {
    h += F("<tr><td class='l'>%s</td><td>%.1f</td></tr>", name.c_str(), s);
    total += s;
  }
  h += F("<tr><th class='l'>total</th><th>%.1f</th></tr></table>", total);
  h += "<h2>Retention policy</h2><pre>" + Esc(PolicyToText(policy)) + "</pre></body></html>\n";
  return h;
}

}  // namespace riskkv
