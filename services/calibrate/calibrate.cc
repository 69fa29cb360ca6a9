// riskkv-calibrate's pipeline (see calibrate.h).
#include "services/calibrate/calibrate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/retention_policy.h"
#include "services/calibrate/report.h"
#include "services/progress.h"

namespace riskkv {
namespace {

double Mean(std::span<const double> v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
}

// Paired summary of `rebuilt` against `exact` (per-request mean NLLs of the same requests).
absl::StatusOr<Measured> Summarize(std::span<const double> rebuilt, std::span<const double> exact,
                                   const CalibrateOptions& o) {
  Measured m;
  for (size_t r = 0; r < exact.size(); ++r) {
    m.deltas.push_back(rebuilt[r] - exact[r]);
    if (m.deltas.back() > o.epsilon) ++m.violations;
  }
  const BootstrapOptions boot{o.bootstrap_resamples, o.seed};
  ASSIGN_OR_RETURN(m.ci95, BootstrapMeanInterval(m.deltas, 0.95, boot));
  ASSIGN_OR_RETURN(m.upper90, BootstrapUpperBound(m.deltas, 0.9, boot));
  m.exact_nll = Mean(exact);
  m.rebuilt_nll = Mean(rebuilt);
  return m;
}

// Spearman rank correlation (average ranks for ties).
double RankCorrelation(std::span<const double> a, std::span<const double> b) {
  auto ranks = [](std::span<const double> v) {
    std::vector<size_t> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * static_cast<double>(i + j);
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  const double ma = Mean(ra), mb = Mean(rb);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0.0;
}

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

void CalibrateOptions::MakeQuick() {
  history = 128;
  eval = 64;
  train = 8;
  validation = 4;
  confirm = 3;
  test = 4;
  noise_requests = 2;
  noise_draws = 1;
  bootstrap_resamples = 500;
}

absl::Status CalibrateOptions::Validate() const {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(m); };
  if (history < 1) return bad(absl::StrCat("--history must be >= 1, got ", history));
  if (eval < 1) return bad(absl::StrCat("--eval-tokens must be >= 1, got ", eval));
  if (train < 1) return bad(absl::StrCat("--train must be >= 1, got ", train));
  if (validation < 2) return bad(absl::StrCat("--validation must be >= 2, got ", validation));
  if (confirm < 0 || confirm == 1)
    return bad(absl::StrCat("--confirm must be 0 or >= 2, got ", confirm));
  if (gate == Gate::kStableSplit && confirm < 2)
    return bad("the stable-split gate needs --confirm >= 2");
  if (test < 2) return bad(absl::StrCat("--test must be >= 2, got ", test));
  if (noise_requests < 0 || noise_requests > validation)
    return bad(absl::StrCat("--noise-requests must be in [0, --validation], got ", noise_requests));
  if (noise_draws < 1) return bad(absl::StrCat("--noise-draws must be >= 1, got ", noise_draws));
  if (!(epsilon >= 0.0) || !std::isfinite(epsilon))
    return bad(absl::StrCat("--epsilon must be a finite number >= 0, got ", epsilon));
  if (!(fractions.train > 0.0) || !(fractions.validation > 0.0) ||
      !(fractions.train + fractions.validation < 1.0)) {
    return bad(absl::StrCat("split fractions train ", fractions.train, " and validation ",
                            fractions.validation, " must be > 0 and leave room for test"));
  }
  if (!(min_prose >= 0.0 && min_prose <= 1.0))
    return bad(absl::StrCat("--min-prose must be in [0, 1], got ", min_prose));
  if (bootstrap_resamples < 100 || bootstrap_resamples > 1000000)
    return bad(absl::StrCat("--bootstrap must be in [100, 1000000], got ", bootstrap_resamples));
  if (exhaustive_max_groups < 1 || exhaustive_max_groups > 16)
    return bad(
        absl::StrCat("--exhaustive-max-groups must be in [1, 16], got ", exhaustive_max_groups));
  if (bank_dtype != DType::kF16 && bank_dtype != DType::kF32) return bad("bank dtype: f16 or f32");
  if (kv_dtype != DType::kF16 && kv_dtype != DType::kF32) return bad("KV dtype: f16 or f32");
  return rule.Validate();
}

absl::StatusOr<std::vector<LayerGroup>> ParseGroupList(const std::string& text) {
  std::vector<LayerGroup> out;
  auto bad = [&](const std::string& part, const char* why) {
    return absl::InvalidArgumentError("--groups: '" + part + "' " + why +
                                      " (expected TARGETS:ANCHORS like 4-5:3,6)");
  };
  auto number = [](const std::string& s, int32_t* v) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) {
      return false;
    }
    *v = static_cast<int32_t>(std::stol(s));
    return true;
  };
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(';', pos);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(pos, end - pos);
    pos = end + 1;
    if (part.empty()) {
      if (end == text.size()) break;
      return bad(part, "is empty");
    }
    const size_t colon = part.find(':');
    if (colon == std::string::npos) return bad(part, "has no ':'");
    const std::string targets = part.substr(0, colon), anchors = part.substr(colon + 1);
    LayerGroup g;
    const size_t dash = targets.find('-');
    int32_t a = 0, b = 0;
    if (!number(targets.substr(0, dash), &a) ||
        (dash != std::string::npos && !number(targets.substr(dash + 1), &b))) {
      return bad(part, "has targets that are not a layer or a range of layers");
    }
    if (dash == std::string::npos) b = a;
    if (b < a) return bad(part, "has a descending target range");
    for (int32_t l = a; l <= b; ++l) g.targets.push_back(l);
    size_t ap = 0;
    while (ap <= anchors.size()) {
      size_t ae = anchors.find(',', ap);
      if (ae == std::string::npos) ae = anchors.size();
      int32_t v = 0;
      if (!number(anchors.substr(ap, ae - ap), &v))
        return bad(part, "has an anchor that is not a layer");
      g.anchors.push_back(v);
      ap = ae + 1;
    }
    out.push_back(std::move(g));
  }
  if (out.empty()) return absl::InvalidArgumentError("--groups lists no group");
  return out;
}

std::vector<LayerGroup> CalibrationResult::ChosenGroups() const {
  std::vector<LayerGroup> out;
  if (chosen < 0) return out;
  for (int g : path[chosen].groups) out.push_back(groups[g]);
  std::sort(out.begin(), out.end(), [](const LayerGroup& a, const LayerGroup& b) {
    return a.targets.front() < b.targets.front();
  });
  return out;
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
  clock.End("fingerprint");

  // 1. Corpus and requests.
  ASSIGN_OR_RETURN(std::string text, ReadCorpusText(o.corpus));
  ASSIGN_OR_RETURN(std::vector<std::string> docs, SplitDocuments(text, o.doc_boundary));
  res.corpus.documents = static_cast<int64_t>(docs.size());
  docs = KeepProse(std::move(docs), o.min_prose);
  res.corpus.dropped = res.corpus.documents - static_cast<int64_t>(docs.size());
  if (docs.size() < 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("corpus ", o.corpus, " has ", docs.size(),
                     " document(s) of prose under the boundary "
                     "pattern '",
                     o.doc_boundary, "' (", res.corpus.dropped,
                     " dropped by --min-prose); three splits need at least 3"));
  }
  auto splits = AssignSplits(std::move(docs), o.fractions, o.seed);
  const int64_t len = o.history + o.eval;
  // Four request sets from four disjoint sets of documents: the validation split's documents
  // feed the selection requests first and the confirmation requests from the documents after.
  struct Part {
    Split split;
    int wanted;
    const char* name;
  };
  const std::array<Part, 4> parts = {{{kTrain, o.train, "train"},
                                      {kValidation, o.validation, "validation"},
                                      {kValidation, o.confirm, "confirmation"},
                                      {kTest, o.test, "test"}}};
  std::array<std::vector<Request>, 4> sets;
  std::array<int64_t, 3> next_doc = {0, 0, 0};
  for (int s = 0; s < 3; ++s) res.splits[s].documents = static_cast<int64_t>(splits[s].size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const Part& part = parts[i];
    if (part.wanted == 0) continue;
    SplitStats& st = res.splits[part.split];
    const auto docs_left = std::span<const std::string>(splits[part.split])
                               .subspan(static_cast<size_t>(next_doc[part.split]));
    int64_t used = 0;
    ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                     TokenizeDocuments(model.tokenizer(), docs_left, part.wanted * len, &used));
    next_doc[part.split] += used;
    st.documents_used += used;
    st.tokens += static_cast<int64_t>(tokens.size());
    sets[i] = MakeRequests(tokens, o.history, o.eval, part.wanted);
    st.requests += static_cast<int>(sets[i].size());
    if (static_cast<int>(sets[i].size()) < part.wanted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the ", SplitName(part.split), " split of ", o.corpus, " has ", docs_left.size(),
          " documents left for ", part.name, " requests, giving ", tokens.size(),
          " tokens: ", sets[i].size(), " requests of ", len, " tokens, ", part.wanted,
          " needed; use a larger corpus, shorter requests or fewer of them"));
    }
  }
  const std::span<const Request> train(sets[0]), val(sets[1]), confirm(sets[2]), test(sets[3]);
  clock.End("corpus");

  // 2. Fit.
  {
    auto b = bar("fit");
    ASSIGN_OR_RETURN(res.fits, FitGroups(model, train, val, res.groups, b->Callback()));
  }
  ASSIGN_OR_RETURN(auto bank, PredictorBank::FromFits(res.fingerprint, o.bank_dtype, res.fits));
  const auto& folded = bank->groups();
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
    ASSIGN_OR_RETURN(Measured m, Summarize(nll[g + 1], nll[0], o));
    res.singleton.push_back(std::move(m));
  }
  const std::vector<std::vector<double>> singleton_nll = nll;
  res.ranking.resize(G);
  std::iota(res.ranking.begin(), res.ranking.end(), 0);
  std::stable_sort(res.ranking.begin(), res.ranking.end(), [&](int a, int b) {
    return res.singleton[a].ci95.mean < res.singleton[b].ci95.mean;
  });
  clock.End("singleton");

  // 4. The ordered path, on validation, confirmation and test requests.
  configs = {{}};
  for (int k = 0; k < G; ++k) {
    std::vector<int> next = configs.back();
    next.push_back(res.ranking[k]);
    configs.push_back(next);
    PathPointResult p;
    p.groups = next;
    for (int g : next) p.layers += static_cast<int>(res.groups[g].targets.size());
    p.kv_fraction = static_cast<double>(p.layers) / n_layers;
    res.path.push_back(std::move(p));
  }
  // Fills `field` of every path point; returns the requests' exact NLLs.
  auto measure_path = [&](std::span<const Request> reqs, const char* phase,
                          Measured PathPointResult::*field) -> absl::StatusOr<std::vector<double>> {
    auto b = bar(phase);
    ASSIGN_OR_RETURN(auto v, MeasureNll(model, reqs, folded, configs, b->Callback()));
    for (int k = 0; k < G; ++k) {
      ASSIGN_OR_RETURN(res.path[k].*field, Summarize(v[k + 1], v[0], o));
    }
    return v[0];
  };
  RETURN_IF_ERROR(measure_path(val, "path", &PathPointResult::validation).status());
  clock.End("path");
  if (o.confirm > 0) {
    RETURN_IF_ERROR(measure_path(confirm, "confirm", &PathPointResult::confirm).status());
    clock.End("confirm");
  }

  // 5. Gates.
  std::vector<PathPoint> points;
  for (const PathPointResult& p : res.path) {
    points.push_back({p.kv_fraction, p.validation.deltas, p.confirm.deltas});
  }
  const BootstrapOptions boot{o.bootstrap_resamples, o.seed};
  for (Gate gate : {Gate::kMean, Gate::kUpper90, Gate::kStableSplit}) {
    GateResult& gr = res.gates[static_cast<int>(gate)];
    gr.gate = gate;
    if (gate == Gate::kStableSplit && o.confirm == 0) continue;  // nothing to confirm on
    ASSIGN_OR_RETURN(gr.decision, ApplyGate(gate, points, o.epsilon, boot));
  }
  res.chosen = res.gates[static_cast<int>(o.gate)].decision.chosen;

  ASSIGN_OR_RETURN(const std::vector<double> test_exact,
                   measure_path(test, "test", &PathPointResult::test));
  ASSIGN_OR_RETURN(res.test_exact, Summarize(test_exact, test_exact, o));
  clock.End("test");

  // 6a. Gaussian replacement of matched per-request K/V NRMSE.
  if (o.noise_requests > 0) {
    const auto reqs = val.first(o.noise_requests);
    const int draws = o.noise_draws;
    std::vector<KvError> err_sum(G);
    std::vector<int> err_count(G, 0);
    auto apply = [&](size_t k, size_t r, const KvCache& exact, KvCache& work) -> absl::Status {
      if (k == 0) return absl::OkStatus();
      const int g = static_cast<int>((k - 1) / draws), d = static_cast<int>((k - 1) % draws);
      const int64_t h = reqs[r].moved_rows();
      RETURN_IF_ERROR(RebuildGroup(work, folded[g], c, model.backend(), 0, h));
      for (int32_t layer : res.groups[g].targets) {
        ASSIGN_OR_RETURN(KvError e, LayerNrmse(exact, work, layer, h));
        if (d == 0) {
          err_sum[g].k += e.k;
          err_sum[g].v += e.v;
          ++err_count[g];
        }
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
      ASSIGN_OR_RETURN(Measured m, Summarize(v[mask], v[0], o));
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

absl::StatusOr<std::unique_ptr<PredictorBank>> MakeChosenBank(const CalibrationResult& res) {
  if (res.chosen < 0) return std::unique_ptr<PredictorBank>();
  std::vector<GroupFit> fits;
  for (const LayerGroup& g : res.ChosenGroups()) {
    for (const GroupFit& f : res.fits) {
      if (f.group == g) fits.push_back(f);
    }
  }
  return PredictorBank::FromFits(res.fingerprint, res.options.bank_dtype, fits);
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
  int rebuilt_layers = 0;
  for (const LayerGroup& g : p.rebuilt_groups) {
    for (int32_t l : g.targets) rebuilt[l] = true, ++rebuilt_layers;
  }
  for (int32_t l = 0; l < res.config.n_layers; ++l) {
    if (!rebuilt[l]) p.kept_layers.push_back(l);
  }
  for (int g : res.ranking) p.singleton_risks.push_back({res.groups[g], delta(res.singleton[g])});
  const GateDecision& d = res.gates[static_cast<int>(o.gate)].decision;
  for (size_t k = 0; k < res.path.size(); ++k) {
    RetentionPolicy::PathPoint pt;
    pt.groups = static_cast<int32_t>(k + 1);
    pt.kv_omitted_fraction = res.path[k].kv_fraction;
    pt.delta_nll = delta(res.path[k].validation);
    if (k < d.statistic.size()) {
      pt.gate_statistic = d.statistic[k];
      pt.passed = d.passed[k];
    }
    p.path.push_back(pt);
  }
  p.kv_bytes_per_token = res.kv_bytes_per_token;
  p.kv_bytes_saved_per_token = res.kv_bytes_per_token * rebuilt_layers / res.config.n_layers;
  p.predictor_bank_sha256 = bank_sha256;
  p.test_delta_nll = delta(res.chosen >= 0 ? res.path[res.chosen].test : res.test_exact);
  p.history_tokens = static_cast<int32_t>(o.history);
  p.eval_tokens = static_cast<int32_t>(o.eval);
  p.kv_dtype = o.kv_dtype == DType::kF16 ? "f16" : "f32";
  return p;
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
  auto write_text = [&](const std::string& name, const std::string& content) -> absl::Status {
    const auto path = out / name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << content;
    f.close();
    if (!f) return absl::InternalError("cannot write " + path.string());
    return absl::OkStatus();
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
