// riskkv-calibrate's selection pipeline, steps 1-6 of calibrate.h: from a model and a corpus to
// the measured candidates, the ordered path, the gates' decisions and the controls.
#include "services/calibrate/calibrate.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kvcodec/kv_codec.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/wire_apply.h"
#include "services/calibrate/paired_stats.h"
#include "services/calibrate/requests.h"
#include "services/progress.h"

namespace riskkv {
namespace {

std::string DefaultPolicyId(const ModelConfig& c) {
  std::string id;
  for (char ch : c.name) {
    const bool alnum = std::isalnum(static_cast<unsigned char>(ch)) != 0;
    if (alnum) {
      id += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    } else if (!id.empty() && id.back() != '-') {
      id += '-';
    }
  }
  while (!id.empty() && id.back() == '-') id.pop_back();
  return id.empty() ? "model" : id;
}

class PhaseClock {
 public:
  explicit PhaseClock(std::vector<std::pair<std::string, double>>* out) : out_(out) {}
  void End(const std::string& name) {
    const auto now = std::chrono::steady_clock::now();
    out_->push_back({name, std::chrono::duration<double>(now - start_).count()});
    start_ = now;
  }

 private:
  std::vector<std::pair<std::string, double>>* out_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace

std::vector<LayerGroup> CalibrationResult::ChosenGroups() const {
  std::vector<LayerGroup> out;
  if (chosen < 0) return out;
  for (int g : path[chosen].groups) out.push_back(groups[g]);
  std::sort(out.begin(), out.end(), [](const LayerGroup& a, const LayerGroup& b) {
    return a.targets.front() < b.targets.front();
  });
  return out;
}

double Measured::MeanKl() const {
  return kl.empty() ? 0.0 : std::accumulate(kl.begin(), kl.end(), 0.0) / kl.size();
}

double Measured::MeanTop1() const {
  return top1.empty() ? 1.0 : std::accumulate(top1.begin(), top1.end(), 0.0) / top1.size();
}

const std::vector<GroupFit>& CalibrationResult::FitsFor(WireForm form) const {
  const auto& own = wire_fits[static_cast<size_t>(form)];
  return own.empty() ? fits : own;
}

absl::StatusOr<CalibrationResult> Calibrate(Model& model, const std::string& model_path,
                                            const CalibrateOptions& o) {
  RETURN_IF_ERROR(o.Validate());
  const ModelConfig& c = model.config();
  if (o.history > c.context_length || o.eval > c.context_length ||
      o.history + o.eval > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrCat("--history + --eval-tokens = ", o.history + o.eval, " exceeds the model's ",
                     c.context_length, "-token context"));
  }
  CalibrationResult res;
  res.options = o;
  res.model_path = model_path;
  res.config = c;
  if (res.options.policy_id.empty()) res.options.policy_id = DefaultPolicyId(c);
  PhaseClock clock(&res.phase_seconds);
  auto bar = [&](const char* phase) { return std::make_shared<ProgressBar>(phase, o.quiet); };

  // Candidates first: a bad group list or an exhaustive search too large fails before any work.
  const auto n_layers = static_cast<int32_t>(c.n_layers);
  if (o.groups.empty()) {
    ASSIGN_OR_RETURN(res.groups, CandidateGroups(n_layers, o.rule));
  } else {
    RETURN_IF_ERROR(ValidateGroups(o.groups, n_layers, o.rule));
    res.groups = o.groups;
  }
  const int G = static_cast<int>(res.groups.size());
  if (G == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("no candidate groups fit a ", n_layers, "-layer model with group size ",
                     o.rule.group_size, " and ", o.rule.anchors_per_side, " anchor(s) per side"));
  }
  if (o.exhaustive && G > o.exhaustive_max_groups) {
    return absl::InvalidArgumentError(
        absl::StrCat("the exhaustive search over ", G, " groups needs ", (1ull << G) - 1,
                     " configurations; --exhaustive-max-groups is ", o.exhaustive_max_groups));
  }

  ASSIGN_OR_RETURN(res.fingerprint, ModelFingerprint(model));
  res.arithmetic =
      model.backend().activation_precision() == ActivationPrecision::kInt8 ? "int8" : "f32";
  clock.End("fingerprint");

  // 1. Corpus and requests.
  ASSIGN_OR_RETURN(RequestSets sets, MakeRequestSets(model.tokenizer(), o, &res));
  res.validation_kinds = sets.kinds[kSelectionSet];
  res.confirm_kinds = sets.kinds[kConfirmSet];
  res.test_kinds = sets.kinds[kTestSet];
  const std::span<const Request> train(sets.requests[kTrainSet]), val(sets.requests[kSelectionSet]),
      confirm(sets.requests[kConfirmSet]), test(sets.requests[kTestSet]);
  const int n_kinds = static_cast<int>(res.kinds.size());
  auto summarize = [&](std::span<const double> rebuilt, std::span<const double> exact,
                       const std::vector<int>& kinds) {
    return Summarize(rebuilt, exact, kinds, n_kinds, o);
  };
  clock.End("corpus");

  // 1b. The transform form's transforms, fitted to the training histories, and its bytes.
  if (std::find(o.wire_forms.begin(), o.wire_forms.end(), WireForm::kTransform) !=
      o.wire_forms.end()) {
    auto b = bar("transforms");
    ASSIGN_OR_RETURN(res.transforms, FitWireTransforms(model, train, o.transform_kind,
                                                       o.transform_step, 8, b->Callback()));
    clock.End("transforms");
  }
  const WireTransforms wire_transforms{res.transforms ? &res.transforms->transforms : nullptr,
                                       o.transform_step};

  // 2. Fit: on exact anchors (ranking, plain form), and with fit_on_wire on each quantized form's
  // decoded anchors, all from the same forward passes.
  std::vector<WireForm> fit_forms = {WireForm::kPlain};
  if (o.fit_on_wire) {
    for (WireForm form : o.wire_forms) {
      if (form != WireForm::kPlain) fit_forms.push_back(form);
    }
  }
  {
    auto b = bar("fit");
    ASSIGN_OR_RETURN(auto fits, FitGroupsForForms(model, train, val, res.groups, fit_forms,
                                                  b->Callback(), &wire_transforms));
    res.fits = std::move(fits[0]);
    for (size_t f = 1; f < fit_forms.size(); ++f) {
      res.wire_fits[static_cast<size_t>(fit_forms[f])] = std::move(fits[f]);
    }
  }
  // Each form's bank, as the target that receives that form holds it.
  std::array<std::unique_ptr<PredictorBank>, kWireFormCount> banks;
  for (WireForm form : fit_forms) {
    ASSIGN_OR_RETURN(banks[static_cast<size_t>(form)],
                     PredictorBank::FromFits(res.fingerprint, o.bank_dtype, res.FitsFor(form)));
  }
  auto folded_for = [&](WireForm form) -> const std::vector<FoldedGroup>& {
    const auto& own = banks[static_cast<size_t>(form)];
    return (own ? own : banks[static_cast<size_t>(WireForm::kPlain)])->groups();
  };
  const auto& folded = folded_for(WireForm::kPlain);
  clock.End("fit");

  // 3. Singleton risks and ranking.
  std::vector<std::vector<int>> configs = {{}};
  for (int g = 0; g < G; ++g) configs.push_back({g});
  std::vector<std::vector<double>> nll;
  {
    auto b = bar("singleton");
    ASSIGN_OR_RETURN(nll, MeasureNll(model, val, folded, configs, b->Callback()));
  }
  for (int g = 0; g < G; ++g) {
    ASSIGN_OR_RETURN(Measured m, summarize(nll[g + 1], nll[0], res.validation_kinds));
    res.singleton.push_back(std::move(m));
  }
  const std::vector<std::vector<double>> singleton_nll = nll;
  res.ranking.resize(G);
  std::iota(res.ranking.begin(), res.ranking.end(), 0);
  std::stable_sort(res.ranking.begin(), res.ranking.end(), [&](int a, int b) {
    return res.singleton[a].ci95.mean < res.singleton[b].ci95.mean;
  });
  clock.End("singleton");

  // 4. The ordered path, on validation, confirmation and test requests: for each wire form, the
  // kept layers sent in that form with the first k ranked groups rebuilt from them (k from 1 for
  // plain, whose k = 0 is exact KV; from 0 for the quantized forms, which is FULL_KV in that
  // form without reconstruction).
  const int64_t moved = o.history - 1;
  // One layer's bytes in a form: computed for the fixed forms, measured for the transform form.
  auto layer_bytes = [&](WireForm form) {
    return form == WireForm::kTransform
               ? res.transforms->bytes_per_token * static_cast<double>(moved)
               : static_cast<double>(
                     LayerWireBytes(form, moved, c.n_kv_heads, c.head_dim, o.kv_dtype));
  };
  const double full_bytes = n_layers * layer_bytes(WireForm::kPlain);
  for (WireForm form : o.wire_forms) {
    std::vector<int> groups;
    for (int k = form == WireForm::kPlain ? 1 : 0; k <= G; ++k) {
      if (k > 0) groups.push_back(res.ranking[k - 1]);
      PathPointResult p;
      p.form = form;
      p.groups = groups;
      std::vector<bool> rebuilt(n_layers, false);
      for (int g : groups) {
        p.layers += static_cast<int>(res.groups[g].targets.size());
        for (int32_t l : res.groups[g].targets) rebuilt[l] = true;
      }
      p.kv_fraction = static_cast<double>(p.layers) / n_layers;
      double sent = 0.0;
      for (int32_t l = 0; l < n_layers; ++l) {
        if (rebuilt[l]) continue;
        p.kept_layers.push_back(l);
        sent += layer_bytes(form);
      }
      p.sent_fraction = sent / full_bytes;
      res.path.push_back(std::move(p));
    }
  }
  const int n_points = static_cast<int>(res.path.size());
  // The configurations of a measurement: -1 is exact KV, k >= 0 path point k (the kept layers
  // through the wire form, as a target receives them, then the groups rebuilt from those
  // anchors).
  auto apply_points = [&](std::span<const Request> reqs, const std::vector<int>& configs) {
    return [&, reqs](size_t config, size_t r, const KvCache&, KvCache& work,
                     Backend& backend) -> absl::Status {
      if (configs[config] < 0) return absl::OkStatus();
      const PathPointResult& p = res.path[configs[config]];
      const int64_t h = reqs[r].moved_rows();
      RETURN_IF_ERROR(ApplyWireForm(p.form, p.kept_layers, h, work, &wire_transforms));
      const auto& form_folded = folded_for(p.form);
      for (int g : p.groups) {
        RETURN_IF_ERROR(RebuildGroup(work, form_folded[g], c, backend, 0, h));
      }
      return absl::OkStatus();
    };
  };
  // Fills `field` of the path points `points` (ascending) and returns the requests' exact NLLs.
  // On the selection requests the exact NLLs are the singleton phase's (so the path skips the
  // exact pass), and the first plain point (the least risky singleton) must reproduce that
  // phase's figures bit for bit.
  auto measure_path = [&](std::span<const Request> reqs, const std::vector<int>& kinds,
                          const char* phase, Measured PathPointResult::*field,
                          const std::vector<int>& points,
                          bool selection) -> absl::StatusOr<std::vector<double>> {
    std::vector<int> configs;
    if (!selection) configs.push_back(-1);
    configs.insert(configs.end(), points.begin(), points.end());
    auto b = bar(phase);
    // Against exact KV (configuration 0) the divergence comes with the NLL.
    QualityTable q;
    if (selection) {
      ASSIGN_OR_RETURN(q.nll, MeasureNllWith(model, reqs, configs.size(),
                                             apply_points(reqs, configs), b->Callback()));
    } else {
      ASSIGN_OR_RETURN(q, MeasureQualityWith(model, reqs, configs.size(),
                                             apply_points(reqs, configs), b->Callback()));
    }
    std::vector<std::vector<double>>& v = q.nll;
    if (selection) {
      for (size_t i = 0; i < points.size(); ++i) {
        const PathPointResult& p = res.path[points[i]];
        if (p.form == WireForm::kPlain && p.groups.size() == 1 &&
            v[i] != singleton_nll[p.groups[0] + 1]) {
          return absl::InternalError(absl::StrCat(
              "the path's first point on the selection requests differs from the singleton "
              "measurement of ",
              res.groups[p.groups[0]].ToString(), ": the forward pass is not deterministic"));
        }
      }
      v.insert(v.begin(), singleton_nll[0]);
    }
    for (size_t i = 0; i < points.size(); ++i) {
      Measured& m = res.path[points[i]].*field;
      ASSIGN_OR_RETURN(m, summarize(v[i + 1], v[0], kinds));
      if (!selection) {
        m.kl = std::move(q.kl[i + 1]);
        m.top1 = std::move(q.top1[i + 1]);
      }
    }
    return v[0];
  };
  std::vector<int> every_point(n_points);
  std::iota(every_point.begin(), every_point.end(), 0);
  const BootstrapOptions boot{o.bootstrap_resamples, o.seed};
  auto gate_point = [&](const PathPointResult& p) {
    return PathPoint{1.0 - p.sent_fraction, p.validation.deltas, p.confirm.deltas,
                     res.validation_kinds, res.confirm_kinds};
  };
  if (o.path_every_point || o.confirm > 0 || o.exhaustive) {
    RETURN_IF_ERROR(measure_path(val, res.validation_kinds, "path", &PathPointResult::validation,
                                 every_point, true)
                        .status());
  } else {
    // A point that passes the Mean and Upper-90 gates at the tightest reported budget is
    // chosen, or beaten by one with fewer bytes, at every budget: points with more bytes are
    // never chosen and are not measured. FULL_KV points have a bound of their own, set by FULL_KV
    // points only, since the choice without reconstruction is made among them alone. The most
    // compact form goes first, as its points are the likeliest to set the bounds low.
    double tightest = o.epsilon;
    for (double e : kReportBudgets) tightest = std::min(tightest, e);
    std::vector<WireForm> forms = o.wire_forms;
    std::stable_sort(forms.begin(), forms.end(),
                     [&](WireForm a, WireForm b) { return layer_bytes(a) < layer_bytes(b); });
    double bound = std::numeric_limits<double>::infinity(), full_kv_bound = bound;
    for (WireForm form : forms) {
      std::vector<int> points;
      for (int k = 0; k < n_points; ++k) {
        const PathPointResult& p = res.path[k];
        if (p.form == form && p.sent_fraction <= (p.groups.empty() ? full_kv_bound : bound)) {
          points.push_back(k);
        }
      }
      if (points.empty()) continue;
      RETURN_IF_ERROR(measure_path(val, res.validation_kinds, "path", &PathPointResult::validation,
                                   points, true)
                          .status());
      for (int k : points) {
        const PathPoint one[] = {gate_point(res.path[k])};
        bool passes = true;
        for (Gate gate : {Gate::kMean, Gate::kUpper90}) {
          ASSIGN_OR_RETURN(GateDecision d, ApplyGate(gate, one, tightest, boot));
          passes = passes && d.passed[0];
        }
        if (!passes) continue;
        bound = std::min(bound, res.path[k].sent_fraction);
        if (res.path[k].groups.empty()) {
          full_kv_bound = std::min(full_kv_bound, res.path[k].sent_fraction);
        }
      }
    }
  }
  std::vector<int> measured_points;
  for (int k = 0; k < n_points; ++k) {
    if (res.path[k].on_selection()) measured_points.push_back(k);
  }
  clock.End("path");
  if (o.confirm > 0) {
    RETURN_IF_ERROR(measure_path(confirm, res.confirm_kinds, "confirm", &PathPointResult::confirm,
                                 every_point, false)
                        .status());
    clock.End("confirm");
  }

  // 5. Gates, over the measured points; a point left unmeasured reads as failing.
  // The gate keeps the point that sends the fewest bytes among those that pass.
  auto apply_gate = [&](Gate gate, double epsilon,
                        const std::vector<int>& subset) -> absl::StatusOr<GateDecision> {
    std::vector<PathPoint> points;
    for (int k : subset) points.push_back(gate_point(res.path[k]));
    ASSIGN_OR_RETURN(GateDecision d, ApplyGate(gate, points, epsilon, boot));
    GateDecision out;
    out.chosen = d.chosen < 0 ? -1 : subset[d.chosen];
    out.statistic.assign(n_points, std::numeric_limits<double>::quiet_NaN());
    out.passed.assign(n_points, false);
    out.worst_kind.assign(n_points, -1);
    for (size_t i = 0; i < subset.size(); ++i) {
      out.statistic[subset[i]] = d.statistic[i];
      out.passed[subset[i]] = d.passed[i];
      out.worst_kind[subset[i]] = d.worst_kind[i];
    }
    return out;
  };
  for (Gate gate : {Gate::kMean, Gate::kUpper90, Gate::kStableSplit}) {
    GateResult& gr = res.gates[static_cast<int>(gate)];
    gr.gate = gate;
    if (gate == Gate::kStableSplit && o.confirm == 0) continue;  // nothing to confirm on
    ASSIGN_OR_RETURN(gr.decision, apply_gate(gate, o.epsilon, measured_points));
  }
  res.chosen = res.gates[static_cast<int>(o.gate)].decision.chosen;
  if (o.gate != Gate::kStableSplit || o.confirm > 0) {
    std::vector<double> budgets = {o.epsilon};
    for (double e : kReportBudgets) {
      if (e != o.epsilon) budgets.push_back(e);
    }
    std::vector<int> no_omission;
    for (int k : measured_points) {
      if (res.path[k].groups.empty()) no_omission.push_back(k);
    }
    for (double e : budgets) {
      BudgetResult b{.epsilon = e};
      ASSIGN_OR_RETURN(GateDecision all, apply_gate(o.gate, e, measured_points));
      b.with_reconstruction = all.chosen;
      if (!no_omission.empty()) {
        ASSIGN_OR_RETURN(GateDecision none, apply_gate(o.gate, e, no_omission));
        b.without_reconstruction = none.chosen;
      }
      res.budgets.push_back(b);
    }
  }

  // The held-out test requests score every point, or the ones the decision is read from.
  if (o.test_every_point) {
    res.test_points = every_point;
  } else {
    std::vector<bool> on_test(n_points, false);
    for (const GateResult& g : res.gates) {
      if (g.decision.chosen >= 0) on_test[g.decision.chosen] = true;
    }
    for (const BudgetResult& b : res.budgets) {
      for (int k : {b.with_reconstruction, b.without_reconstruction}) {
        if (k >= 0) on_test[k] = true;
      }
    }
    for (int k = 0; k < n_points; ++k) {
      if (res.path[k].groups.empty()) on_test[k] = true;
      if (on_test[k]) res.test_points.push_back(k);
    }
  }
  ASSIGN_OR_RETURN(
      const std::vector<double> test_exact,
      measure_path(test, res.test_kinds, "test", &PathPointResult::test, res.test_points, false));
  ASSIGN_OR_RETURN(res.test_exact, summarize(test_exact, test_exact, res.test_kinds));
  clock.End("test");

  // 6a. Gaussian replacement of matched per-request K/V NRMSE.
  if (o.noise_requests > 0) {
    const auto reqs = val.first(o.noise_requests);
    const int draws = o.noise_draws;
    // Each request's rebuild errors per group and target layer, written by whichever worker
    // scores the request and summed in request order afterwards.
    std::vector<std::vector<std::vector<KvError>>> errors(reqs.size(),
                                                          std::vector<std::vector<KvError>>(G));
    auto apply = [&](size_t k, size_t r, const KvCache& exact, KvCache& work,
                     Backend& backend) -> absl::Status {
      if (k == 0) return absl::OkStatus();
      const int g = static_cast<int>((k - 1) / draws), d = static_cast<int>((k - 1) % draws);
      const int64_t h = reqs[r].moved_rows();
      RETURN_IF_ERROR(RebuildGroup(work, folded[g], c, backend, 0, h));
      for (int32_t layer : res.groups[g].targets) {
        ASSIGN_OR_RETURN(KvError e, LayerNrmse(exact, work, layer, h));
        if (d == 0) errors[r][g].push_back(e);
        const uint64_t seed = o.seed * 0x9E3779B97F4A7C15ull ^ (r << 40) ^ (uint64_t(d) << 24) ^
                              (uint64_t(layer) << 8) ^ uint64_t(g);
        RETURN_IF_ERROR(ReplaceWithMatchedNoise(exact, work, layer, h, e, seed));
      }
      return absl::OkStatus();
    };
    std::vector<std::vector<double>> v;
    {
      auto b = bar("noise");
      ASSIGN_OR_RETURN(
          v, MeasureNllWith(model, reqs, 1 + static_cast<size_t>(G) * draws, apply, b->Callback()));
    }
    std::vector<KvError> err_sum(G);
    std::vector<int> err_count(G, 0);
    for (size_t r = 0; r < reqs.size(); ++r) {
      for (int g = 0; g < G; ++g) {
        for (const KvError& e : errors[r][g]) {
          err_sum[g].k += e.k;
          err_sum[g].v += e.v;
          ++err_count[g];
        }
      }
    }
    std::vector<double> rebuilt, noise;
    for (int g = 0; g < G; ++g) {
      NoiseResult n;
      n.group = g;
      std::vector<double> noise_d(reqs.size(), 0.0), rebuilt_d(reqs.size());
      for (size_t r = 0; r < reqs.size(); ++r) {
        for (int d = 0; d < draws; ++d) noise_d[r] += (v[1 + g * draws + d][r] - v[0][r]) / draws;
        rebuilt_d[r] = singleton_nll[g + 1][r] - singleton_nll[0][r];
      }
      ASSIGN_OR_RETURN(n.noise_ci95, BootstrapMeanInterval(noise_d, 0.95, boot));
      ASSIGN_OR_RETURN(n.rebuilt_ci95, BootstrapMeanInterval(rebuilt_d, 0.95, boot));
      n.noise_mean = n.noise_ci95.mean;
      n.rebuilt_mean = n.rebuilt_ci95.mean;
      n.nrmse_k = err_count[g] ? err_sum[g].k / err_count[g] : 0.0;
      n.nrmse_v = err_count[g] ? err_sum[g].v / err_count[g] : 0.0;
      rebuilt.push_back(n.rebuilt_mean);
      noise.push_back(n.noise_mean);
      res.noise.push_back(n);
    }
    res.noise_rank_correlation = G >= 3 ? RankCorrelation(rebuilt, noise) : std::nan("");
    clock.End("noise");
  }

  // 6b. Every subset, for small G.
  if (o.exhaustive) {
    std::vector<std::vector<int>> subsets = {{}};
    for (uint32_t mask = 1; mask < (1u << G); ++mask) {
      std::vector<int> s;
      for (int g = 0; g < G; ++g) {
        if (mask & (1u << g)) s.push_back(g);
      }
      subsets.push_back(std::move(s));
    }
    std::vector<std::vector<double>> v;
    {
      auto b = bar("exhaustive");
      ASSIGN_OR_RETURN(v, MeasureNll(model, val, folded, subsets, b->Callback()));
    }
    for (uint32_t mask = 1; mask < (1u << G); ++mask) {
      ExhaustiveResult e;
      e.mask = mask;
      for (int g : subsets[mask]) e.layers += static_cast<int>(res.groups[g].targets.size());
      e.kv_fraction = static_cast<double>(e.layers) / n_layers;
      ASSIGN_OR_RETURN(Measured m, summarize(v[mask], v[0], res.validation_kinds));
      e.mean = m.ci95.mean;
      e.upper90 = m.upper90;
      res.exhaustive.push_back(e);
    }
    clock.End("exhaustive");
  }

  // Storage per group (the paper's Table III) and KV sizes.
  const int64_t kvw = c.kv_width();
  for (const LayerGroup& g : res.groups) {
    const int64_t f = 2 * static_cast<int64_t>(g.anchors.size()) * kvw;
    const auto t = static_cast<int64_t>(g.targets.size());
    StorageResult s;
    s.unfolded_bytes = t * (c.hidden * f + c.hidden) * 4;
    s.folded_f32_bytes = t * (2 * kvw * f + 2 * kvw) * 4;
    s.folded_f16_bytes = t * (2 * kvw * f * 2 + 2 * kvw * 4);
    res.storage.push_back(s);
  }
  res.kv_bytes_per_token = c.n_layers * 2 * RowBytes(o.kv_dtype, kvw);
  return res;
}

}  // namespace riskkv
