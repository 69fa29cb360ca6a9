// riskkv-calibrate's pipeline end to end on an 8-layer tiny model: the outputs load back and
// agree with each other, measurements repeat exactly, and bad options fail before any work.
#include "services/calibrate/calibrate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "common/kvcodec/kv_codec.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/policy_ladder.h"
#include "common/recovery/retention_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

// English-looking documents, each starting with a "Doc N" heading at column 0.
std::string SyntheticCorpus(int documents, unsigned seed = 5) {
  const char* words[] = {"the",  "hacker", "wrote", "a",       "program", "that", "ran",
                         "on",   "every",  "old",   "machine", "in",      "lab",  "and",
                         "then", "it",     "was",   "called",  "by",      "name", "of"};
  std::mt19937 rng(seed);
  std::string text;
  for (int d = 0; d < documents; ++d) {
    text += "Doc " + std::to_string(d) + "\n";
    for (int line = 0; line < 3; ++line) {
      std::string l = "   ";
      while (l.size() < 60) l += std::string(words[rng() % std::size(words)]) + " ";
      text += l + "\n";
    }
  }
  return text;
}

class CalibrateTiny : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ =
        new fs::path(fs::temp_directory_path() / ("riskkv_calibrate_" + std::to_string(getpid())));
    fs::create_directories(*dir_);
    std::ofstream(*dir_ / "corpus.txt") << SyntheticCorpus(300);
    // A second kind: a directory of two files of other text.
    fs::create_directories(*dir_ / "other");
    std::ofstream(*dir_ / "other" / "a.txt") << SyntheticCorpus(150, 7);
    std::ofstream(*dir_ / "other" / "b.txt") << SyntheticCorpus(150, 9);
    std::ofstream(*dir_ / "little.txt") << SyntheticCorpus(2, 11);
    auto m = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                         {.threads = 2, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    fs::remove_all(*dir_);
    delete dir_;
  }

  static CalibrateOptions Quick() {
    CalibrateOptions o;
    o.MakeQuick();
    o.corpus = {{"text", (*dir_ / "corpus.txt").string(), "^Doc "}};
    o.history = 48;
    o.eval = 24;
    o.train = 6;
    o.validation = 4;
    o.confirm = 2;
    o.test = 3;
    o.noise_requests = 2;
    o.rule.group_size = 1;  // layers 1, 3 and 5 are the candidates
    o.exhaustive = true;
    o.wire_forms = {WireForm::kPlain, WireForm::kInt8, WireForm::kInt4};
    o.test_every_point = true;
    o.quiet = true;
    return o;
  }

  static fs::path* dir_;
  static Model* model_;
};
fs::path* CalibrateTiny::dir_ = nullptr;
Model* CalibrateTiny::model_ = nullptr;

TEST_F(CalibrateTiny, QuickRunWritesOutputsThatLoadBack) {
  CalibrateOptions o = Quick();
  o.epsilon = 10.0;  // random weights: a wide budget so the gate admits configurations
  auto res = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(res.ok()) << res.status();
  const CalibrationResult& r = *res;
  const int G = 3;
  ASSERT_EQ(r.groups.size(), static_cast<size_t>(G));
  EXPECT_EQ(r.groups[1].targets, std::vector<int32_t>({3}));
  // The plain path (k = 1..G), then int8 and int4 paths from k = 0 (FULL_KV in that form).
  const int n_points = G + 2 * (G + 1);
  ASSERT_EQ(r.path.size(), static_cast<size_t>(n_points));
  ASSERT_EQ(r.exhaustive.size(), (1u << G) - 1);
  ASSERT_EQ(r.noise.size(), static_cast<size_t>(G));
  for (int s = 0; s < 3; ++s) EXPECT_GT(r.splits[s].documents, 0);
  EXPECT_EQ(r.splits[kTest].requests, 3);

  // The ordered path adds groups in ranking order; each point is a real measurement, and the
  // same configuration measured twice (singleton vs path point 1, path vs exhaustive subset) on
  // the same requests gives the same per-request numbers.
  for (int k = 0; k < G; ++k) {
    EXPECT_EQ(r.path[k].groups.back(), r.ranking[k]);
    EXPECT_EQ(r.path[k].layers, k + 1);
    EXPECT_EQ(r.path[k].validation.deltas.size(), 4u);
    EXPECT_EQ(r.path[k].confirm.deltas.size(), 2u);
    EXPECT_EQ(r.path[k].test.deltas.size(), 3u);
    uint32_t mask = 0;
    for (int g : r.path[k].groups) mask |= 1u << g;
    EXPECT_NEAR(r.exhaustive[mask - 1].mean, r.path[k].validation.ci95.mean, 1e-12);
  }
  EXPECT_EQ(r.path[0].validation.deltas, r.singleton[r.ranking[0]].deltas);
  for (int k = 1; k < G; ++k) {
    EXPECT_LE(r.singleton[r.ranking[k - 1]].ci95.mean, r.singleton[r.ranking[k]].ci95.mean);
  }
  // Every configuration changes something: rebuilt layers of a random model are not exact.
  EXPECT_NE(r.path[G - 1].validation.ci95.mean, 0.0);

  // The quantized paths: the same ranking, the kept layers in the form, and the bytes a
  // migration of the moved rows (history - 1 = 47) sends, from the codec's own sizes.
  const int64_t kvh = model_->config().n_kv_heads, hd = model_->config().head_dim;
  const int64_t moved = 47,
                plain_layer = LayerWireBytes(WireForm::kPlain, moved, kvh, hd, DType::kF16);
  EXPECT_EQ(plain_layer, 2 * moved * 32 * 2);
  for (int f = 0; f < 2; ++f) {
    const WireForm form = f == 0 ? WireForm::kInt8 : WireForm::kInt4;
    const int64_t layer_bytes = LayerWireBytes(form, moved, kvh, hd, DType::kF16);
    EXPECT_LT(layer_bytes, plain_layer / (f == 0 ? 1 : 2));
    for (int k = 0; k <= G; ++k) {
      const PathPointResult& p = r.path[G + f * (G + 1) + k];
      EXPECT_EQ(p.form, form);
      ASSERT_EQ(p.groups.size(), static_cast<size_t>(k));
      for (int i = 0; i < k; ++i) EXPECT_EQ(p.groups[i], r.ranking[i]);
      EXPECT_EQ(p.kept_layers.size(), static_cast<size_t>(8 - k));
      EXPECT_DOUBLE_EQ(p.sent_fraction,
                       static_cast<double>((8 - k) * layer_bytes) / (8 * plain_layer));
      EXPECT_EQ(p.test.deltas.size(), 3u);
      // Quantized anchors change the continuation even with nothing rebuilt.
      EXPECT_NE(p.validation.ci95.mean, 0.0) << WireFormName(form) << " k=" << k;
    }
  }
  for (int k = 0; k < G; ++k) {
    EXPECT_DOUBLE_EQ(r.path[k].sent_fraction, static_cast<double>(8 - (k + 1)) / 8);
  }
  EXPECT_EQ(r.arithmetic, "f32");

  // Gate: epsilon 10 admits everything, so the point sending the fewest bytes is chosen: int4
  // with every group rebuilt.
  EXPECT_EQ(r.chosen, n_points - 1);
  EXPECT_EQ(r.gates[static_cast<int>(Gate::kMean)].decision.chosen, n_points - 1);
  // The same gate at the report's budgets: at 10 the choice above, and int4 FULL_KV without
  // reconstruction; at the small ones whatever passes has its upper bound within budget.
  ASSERT_EQ(r.budgets.size(), 3u);
  EXPECT_EQ(r.budgets[0].epsilon, 10.0);
  EXPECT_EQ(r.budgets[0].with_reconstruction, r.chosen);
  EXPECT_EQ(r.budgets[0].without_reconstruction, G + (G + 1));
  for (const BudgetResult& b : r.budgets) {
    for (int k : {b.with_reconstruction, b.without_reconstruction}) {
      if (k >= 0) {
        EXPECT_LE(r.path[k].validation.upper90, b.epsilon) << b.epsilon;
      }
    }
    if (b.without_reconstruction >= 0) {
      EXPECT_TRUE(r.path[b.without_reconstruction].groups.empty());
    }
  }

  const fs::path out = *dir_ / "out";
  ASSERT_TRUE(WriteOutputs(r, out.string()).ok());
  auto fp = ModelFingerprint(*model_);
  ASSERT_TRUE(fp.ok());
  auto policy = ReadPolicy((out / "policy.pb").string(), 8, *fp);
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->policy_id, "tiny-llama-deep");
  EXPECT_EQ(policy->gate, "upper90");
  EXPECT_EQ(policy->rebuilt_groups.size(), static_cast<size_t>(G));
  EXPECT_EQ(policy->kept_layers.size(), static_cast<size_t>(8 - G));
  EXPECT_EQ(policy->singleton_risks.size(), static_cast<size_t>(G));
  ASSERT_EQ(policy->path.size(), static_cast<size_t>(n_points));
  EXPECT_EQ(policy->path[0].wire_form, "plain");
  EXPECT_EQ(policy->path[G].wire_form, "int8");
  EXPECT_EQ(policy->path[G].groups, 0);
  EXPECT_DOUBLE_EQ(policy->path[n_points - 1].kv_sent_fraction, r.path[n_points - 1].sent_fraction);
  EXPECT_EQ(policy->wire_form, "int4");
  EXPECT_EQ(PolicyWireForm(*policy), WireForm::kInt4);
  EXPECT_EQ(policy->arithmetic, "f32");
  EXPECT_EQ(policy->history_tokens, 48);
  EXPECT_EQ(policy->kv_dtype, "f16");
  EXPECT_EQ(policy->kv_bytes_per_token, 8 * 2 * 32 * 2);
  EXPECT_EQ(policy->kv_bytes_saved_per_token,
            std::llround(8 * 2 * 32 * 2 * (1 - r.path[n_points - 1].sent_fraction)));
  EXPECT_EQ(policy->test_delta_nll.requests, 3);
  EXPECT_DOUBLE_EQ(policy->test_delta_nll.mean, r.path[n_points - 1].test.ci95.mean);

  auto bank = PredictorBank::Open((out / "bank.rkvbank").string(), *fp);
  ASSERT_TRUE(bank.ok()) << bank.status();
  EXPECT_EQ((*bank)->content_hash(), policy->predictor_bank_sha256);
  ASSERT_EQ((*bank)->groups().size(), static_cast<size_t>(G));
  for (const LayerGroup& g : policy->rebuilt_groups) {
    const FoldedGroup* fg = (*bank)->FindGroupForLayer(g.targets.front());
    ASSERT_NE(fg, nullptr);
    EXPECT_EQ(fg->group, g);
  }
  // Joint calibration: the int4 configuration ships the predictors fitted on int4-decoded
  // anchors, which differ from the exact-anchor fits the plain path and the ranking use.
  EXPECT_TRUE(r.options.fit_on_wire);
  ASSERT_EQ(r.wire_fits[static_cast<size_t>(WireForm::kInt4)].size(), static_cast<size_t>(G));
  ASSERT_EQ(r.wire_fits[static_cast<size_t>(WireForm::kInt8)].size(), static_cast<size_t>(G));
  EXPECT_TRUE(r.wire_fits[static_cast<size_t>(WireForm::kPlain)].empty());
  EXPECT_EQ(&r.FitsFor(WireForm::kPlain), &r.fits);
  auto int4_bank = PredictorBank::FromFits(*fp, o.bank_dtype, r.FitsFor(WireForm::kInt4));
  auto plain_bank = PredictorBank::FromFits(*fp, o.bank_dtype, r.fits);
  ASSERT_TRUE(int4_bank.ok() && plain_bank.ok());
  EXPECT_EQ((*int4_bank)->content_hash(), policy->predictor_bank_sha256);
  EXPECT_NE((*plain_bank)->content_hash(), policy->predictor_bank_sha256);
  // The ladder: every int4 point and the k = 0 points of the other forms are rungs (the bank
  // holds the int4 fits); the plain and int8 points that rebuild used other fits.
  for (size_t k = 0; k < policy->path.size(); ++k) {
    const RetentionPolicy::PathPoint& pt = policy->path[k];
    EXPECT_EQ(pt.in_bank, pt.wire_form == "int4" || pt.groups == 0) << "path point " << k;
  }
  EXPECT_EQ(PolicyRungs(*policy).size(), static_cast<size_t>(G + 1 + 2));  // int4, int8, exact
  // Table III's f16 figure is what the bank really stores.
  int64_t f16 = 0;
  for (const StorageResult& s : r.storage) f16 += s.folded_f16_bytes;
  EXPECT_EQ((*bank)->bytes(), f16);
  EXPECT_LT(r.storage[0].folded_f16_bytes, r.storage[0].folded_f32_bytes);

  std::ifstream html_in(out / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_in)), {});
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  EXPECT_EQ(svgs, 4u);  // layer strip, singleton risk, ordered path, noise control
  for (const char* part :
       {"Table I", "Table III", "Quality gates", "Bytes sent at each budget", "The policy's ladder",
        "Gaussian noise", "Exhaustive search", "</html>"}) {
    EXPECT_NE(html.find(part), std::string::npos) << part;
  }

  for (const char* name : {"layers", "singleton-risk", "ordered-path", "noise-control"}) {
    std::ifstream svg_in(out / (std::string(name) + ".svg"));
    const std::string svg((std::istreambuf_iterator<char>(svg_in)), {});
    EXPECT_EQ(svg.rfind("<svg xmlns=", 0), 0u) << name;
    EXPECT_NE(html.find(svg), std::string::npos) << name << ".svg is the report's chart";
  }

  std::ifstream json_in(out / "calibration.json");
  auto j = nlohmann::json::parse(json_in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["path"].size(), static_cast<size_t>(n_points));
  EXPECT_EQ(j["path"][G + 1]["wire_form"], "int8");
  EXPECT_EQ(j["predictor_bank_sha256"], policy->predictor_bank_sha256);
  EXPECT_EQ(j["chosen"]["path_index"], n_points - 1);
  EXPECT_EQ(j["chosen"]["wire_form"], "int4");
  EXPECT_EQ(j["chosen"]["arithmetic"], "f32");
  EXPECT_EQ(j["chosen"]["fit_anchors"], "wire");
  ASSERT_EQ(j["budgets"].size(), 3u);
  EXPECT_EQ(j["budgets"][0]["without_reconstruction"]["wire_form"], "int4");
  // The ladder as the policy carries it: its rungs by bytes, the chosen one among them, the
  // hull's ends the fewest bytes and the least damage.
  const std::vector<Rung> rungs = PolicyRungs(*policy), hull = LowerHull(rungs);
  ASSERT_EQ(j["ladder"].size(), rungs.size());
  for (size_t i = 0; i < rungs.size(); ++i) {
    EXPECT_EQ(j["ladder"][i]["groups"], rungs[i].groups);
    EXPECT_EQ(j["ladder"][i]["sent_fraction"], rungs[i].sent_fraction);
    EXPECT_EQ(j["ladder"][i]["hull"], std::find(hull.begin(), hull.end(), rungs[i]) != hull.end());
  }
  EXPECT_EQ(j["ladder"][0]["path_index"], n_points - 1);  // the chosen point sends the least
  EXPECT_EQ(j["ladder"][0]["hull"], true);
  for (size_t k = 0; k < j["path"].size(); ++k) {
    EXPECT_EQ(j["path"][k]["rung"], InBank(r, k)) << k;
  }

  std::ifstream text_in(out / "policy.txt");
  const std::string text((std::istreambuf_iterator<char>(text_in)), {});
  EXPECT_NE(text.find("predictor_bank_sha256: \"" + policy->predictor_bank_sha256),
            std::string::npos);
}

// By default the test split scores only the points a user reads the decision from, with the
// same per-request figures as a run that scores every point.
TEST_F(CalibrateTiny, TestSplitScoresTheChosenPointsAsTheFullRunDoes) {
  CalibrateOptions o = Quick();
  o.exhaustive = false;
  o.noise_requests = 0;
  o.epsilon = 10.0;
  auto all = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(all.ok()) << all.status();
  const int n_points = static_cast<int>(all->path.size());
  EXPECT_EQ(all->test_points.size(), static_cast<size_t>(n_points));
  // A budget that the middle of the int8 path meets, so the choices fall inside the path.
  o.epsilon = std::max(1e-6, all->path[n_points / 2].validation.upper90);
  o.test_every_point = false;
  auto chosen = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  const CalibrationResult& r = *chosen;
  std::vector<bool> expected(n_points, false);
  for (const GateResult& g : r.gates) {
    if (g.decision.chosen >= 0) expected[g.decision.chosen] = true;
  }
  for (const BudgetResult& b : r.budgets) {
    for (int k : {b.with_reconstruction, b.without_reconstruction}) {
      if (k >= 0) expected[k] = true;
    }
  }
  ASSERT_GE(r.chosen, 0);
  int scored = 0;
  for (int k = 0; k < n_points; ++k) {
    const PathPointResult& p = r.path[k];
    if (p.groups.empty()) expected[k] = true;  // FULL_KV in each quantized form
    EXPECT_EQ(p.validation.deltas, all->path[k].validation.deltas) << k;
    EXPECT_EQ(p.on_test(), expected[k]) << k;
    if (expected[k]) {
      ++scored;
      EXPECT_EQ(p.test.deltas, all->path[k].test.deltas) << k;
      EXPECT_EQ(p.test.ci95.mean, all->path[k].test.ci95.mean) << k;
    } else {
      EXPECT_TRUE(p.test.deltas.empty()) << k;
    }
  }
  EXPECT_EQ(r.test_points.size(), static_cast<size_t>(scored));
  EXPECT_LT(scored, n_points);
  EXPECT_EQ(r.test_exact.exact_nll, all->test_exact.exact_nll);

  // The outputs leave the unscored points' test figures out rather than print zeros.
  const fs::path out = *dir_ / "chosen-test";
  ASSERT_TRUE(WriteOutputs(r, out.string()).ok());
  std::ifstream json_in(out / "calibration.json");
  const auto j = nlohmann::json::parse(json_in);
  EXPECT_EQ(j["options"]["test_points"], "chosen");
  for (int k = 0; k < n_points; ++k) {
    EXPECT_EQ(j["path"][k].contains("test"), expected[k]) << k;
  }
  std::ifstream html_in(out / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_in)), {});
  EXPECT_NE(html.find("not scored on the test split"), std::string::npos);
  // The chart's test lines join consecutive scored points only (the plain line also joins its
  // first point to exact KV): an unscored point in between starts a new line.
  int joins = 0;
  bool plain_scored = false;
  for (int k = 0; k < n_points; ++k) {
    plain_scored |= r.path[k].form == WireForm::kPlain && expected[k];
    if (k > 0 && r.path[k].form == r.path[k - 1].form && expected[k] && expected[k - 1]) ++joins;
  }
  std::ifstream svg_in(out / "ordered-path.svg");
  const std::string svg((std::istreambuf_iterator<char>(svg_in)), {});
  int drawn = 0;
  for (size_t at = svg.find("<path d='"); at != std::string::npos;
       at = svg.find("<path d='", at + 1)) {
    const size_t end = svg.find("'", at + 9);
    if (svg.compare(end, 20, "' class='test-line'/") != 0) continue;
    const std::string d = svg.substr(at + 9, end - at - 9);
    drawn += static_cast<int>(std::count(d.begin(), d.end(), 'L'));
  }
  EXPECT_EQ(drawn, joins + (plain_scored ? 1 : 0));
}

// Without confirmation requests or the exhaustive search, the selection requests skip the points
// that send more bytes than a measured point passing the Mean and Upper-90 gates at every
// reported budget. Every decision equals the run that measures every point, every measured point
// has the same numbers, and the outputs leave the skipped points' selection figures out.
TEST_F(CalibrateTiny, PathSkipsOnlyPointsNoGateCanChoose) {
  CalibrateOptions o = Quick();
  o.exhaustive = false;
  o.noise_requests = 0;
  o.confirm = 0;
  o.path_every_point = true;
  o.epsilon = 10.0;
  auto probe = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int n_points = static_cast<int>(probe->path.size());
  // The budget: the lowest statistic of both gates at any point, so that point passes every
  // budget the run reports (the gates' statistics do not depend on the budget).
  const GateDecision& mean = probe->gates[static_cast<int>(Gate::kMean)].decision;
  const GateDecision& upper = probe->gates[static_cast<int>(Gate::kUpper90)].decision;
  double eps = std::numeric_limits<double>::infinity();
  for (int k = 0; k < n_points; ++k) {
    eps = std::min(eps, std::max({mean.statistic[k], upper.statistic[k], 0.0}));
  }
  o.epsilon = eps;
  auto all = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(all.ok()) << all.status();
  o.path_every_point = false;
  auto needed = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(needed.ok()) << needed.status();
  const CalibrationResult& r = *needed;

  EXPECT_EQ(r.chosen, all->chosen);
  for (Gate g : {Gate::kMean, Gate::kUpper90}) {
    EXPECT_EQ(r.gates[static_cast<int>(g)].decision.chosen,
              all->gates[static_cast<int>(g)].decision.chosen)
        << GateName(g);
  }
  ASSERT_EQ(r.budgets.size(), all->budgets.size());
  for (size_t b = 0; b < r.budgets.size(); ++b) {
    EXPECT_EQ(r.budgets[b].with_reconstruction, all->budgets[b].with_reconstruction) << b;
    EXPECT_EQ(r.budgets[b].without_reconstruction, all->budgets[b].without_reconstruction) << b;
  }
  // The bounds: the fewest bytes of a point, and of a FULL_KV point, that passes both gates at
  // the tightest budget.
  double tightest = eps;
  for (double e : kReportBudgets) tightest = std::min(tightest, e);
  double bound = std::numeric_limits<double>::infinity(), full_kv_bound = bound;
  for (int k = 0; k < n_points; ++k) {
    if (mean.statistic[k] <= tightest && upper.statistic[k] <= tightest) {
      bound = std::min(bound, all->path[k].sent_fraction);
      if (all->path[k].groups.empty()) {
        full_kv_bound = std::min(full_kv_bound, all->path[k].sent_fraction);
      }
    }
  }
  ASSERT_LT(bound, 1.0);
  int skipped = 0;
  for (int k = 0; k < n_points; ++k) {
    const PathPointResult& p = r.path[k];
    if (p.on_selection()) {
      EXPECT_EQ(p.validation.deltas, all->path[k].validation.deltas) << k;
    } else {
      ++skipped;
      EXPECT_GT(p.sent_fraction, p.groups.empty() ? full_kv_bound : bound) << k;
      EXPECT_TRUE(std::isnan(r.gates[static_cast<int>(Gate::kUpper90)].decision.statistic[k]));
    }
    // Whatever sends no more than its bound is measured: the gates need it (the choice without
    // reconstruction is made among FULL_KV points alone).
    if (p.sent_fraction <= (p.groups.empty() ? full_kv_bound : bound)) {
      EXPECT_TRUE(p.on_selection()) << k;
    }
  }
  EXPECT_GT(skipped, 0);

  const fs::path out = *dir_ / "needed-path";
  ASSERT_TRUE(WriteOutputs(r, out.string()).ok());
  std::ifstream json_in(out / "calibration.json");
  const auto j = nlohmann::json::parse(json_in);
  EXPECT_EQ(j["options"]["path_points"], "needed");
  // The ladder's path_index counts in this file's path, which lists the unmeasured points too.
  int indexed = 0;
  for (const auto& rung : j["ladder"]) {
    const int k = rung["path_index"];
    if (k < 0) continue;
    ++indexed;
    ASSERT_LT(k, n_points);
    EXPECT_TRUE(r.path[k].on_selection()) << k;
    EXPECT_EQ(j["path"][k]["groups"], rung["groups"]) << k;
    EXPECT_EQ(j["path"][k]["wire_form"], rung["wire_form"]) << k;
    EXPECT_EQ(j["path"][k]["rung"], true) << k;
  }
  EXPECT_GT(indexed, 1);
  for (int k = 0; k < n_points; ++k) {
    EXPECT_EQ(j["path"][k].contains("validation"), r.path[k].on_selection()) << k;
    EXPECT_EQ(j["path"][k].contains("gates"), r.path[k].on_selection()) << k;
  }
  std::ifstream html_in(out / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_in)), {});
  EXPECT_NE(html.find("not measured: a point with fewer bytes passes"), std::string::npos);
  auto policy = ReadPolicy((out / "policy.pb").string(), 0, "");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->path.size(), static_cast<size_t>(n_points - skipped));
}

TEST_F(CalibrateTiny, ExactAnchorFitsServeEveryForm) {
  CalibrateOptions o = Quick();
  o.epsilon = 10.0;
  o.fit_on_wire = false;
  o.exhaustive = false;
  o.noise_requests = 0;
  auto res = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(res.ok()) << res.status();
  for (const auto& own : res->wire_fits) EXPECT_TRUE(own.empty());
  EXPECT_EQ(&res->FitsFor(WireForm::kInt4), &res->fits);
  ASSERT_GE(res->chosen, 0);
  EXPECT_EQ(res->path[res->chosen].form, WireForm::kInt4);
  auto fp = ModelFingerprint(*model_);
  ASSERT_TRUE(fp.ok());
  // Every form rebuilds with the same fits: every measured point is a rung.
  for (size_t k = 0; k < res->path.size(); ++k) {
    EXPECT_EQ(InBank(*res, k), res->path[k].on_selection()) << "path point " << k;
  }
  auto chosen = MakePolicyBank(*res);
  auto plain = PredictorBank::FromFits(*fp, o.bank_dtype, res->fits);
  ASSERT_TRUE(chosen.ok() && plain.ok());
  ASSERT_NE(*chosen, nullptr);
  EXPECT_EQ((*chosen)->content_hash(), (*plain)->content_hash());
}

// The transform form: transforms fitted to the training histories, its bytes measured, its path
// priced at those bytes, its predictors fitted on its decoded anchors, and when chosen, a policy
// that names its step and a bank that carries its transforms.
TEST_F(CalibrateTiny, TransformFormIsFittedPricedAndShippedInTheBank) {
  CalibrateOptions o = Quick();
  o.epsilon = 10.0;
  o.exhaustive = false;
  o.noise_requests = 0;
  o.confirm = 0;
  o.wire_forms = {WireForm::kInt4, WireForm::kTransform};
  o.transform_step = 2.0;  // coarse: far fewer bytes than int4 on these rows
  auto res = Calibrate(*model_, "tiny_llama_deep.gguf", o);
  ASSERT_TRUE(res.ok()) << res.status();
  const CalibrationResult& r = *res;
  ASSERT_TRUE(r.transforms.has_value());
  const int64_t n_layers = model_->config().n_layers, moved = 47;
  ASSERT_EQ(static_cast<int64_t>(r.transforms->transforms.layers.size()), n_layers);
  EXPECT_EQ(r.transforms->transforms.kind, TransformKind::kPca);
  EXPECT_EQ(r.transforms->rows, 6 * (moved - 1));  // every training history but its sink row
  EXPECT_EQ(r.transforms->byte_rows, 6 * moved);
  const double f16_layer = 2.0 * 32 * 2;  // keys and values of one row in f16
  EXPECT_GT(r.transforms->bytes_per_token, 0.0);
  EXPECT_LT(r.transforms->bytes_per_token, f16_layer);
  const double plain_layer =
      static_cast<double>(LayerWireBytes(WireForm::kPlain, moved, model_->config().n_kv_heads,
                                         model_->config().head_dim, DType::kF16));
  int transform_points = 0;
  for (const PathPointResult& p : r.path) {
    if (p.form != WireForm::kTransform) continue;
    ++transform_points;
    EXPECT_NEAR(p.sent_fraction,
                static_cast<double>(p.kept_layers.size()) * r.transforms->bytes_per_token * moved /
                    (n_layers * plain_layer),
                1e-12);
  }
  EXPECT_EQ(transform_points, 4);  // k = 0..G
  // Fitted on the transform form's decoded anchors: other maps than the exact anchors'.
  const auto& own = r.wire_fits[static_cast<size_t>(WireForm::kTransform)];
  ASSERT_EQ(own.size(), r.fits.size());
  EXPECT_NE(own[0].layers[0].a_k, r.fits[0].layers[0].a_k);
  ASSERT_GE(r.chosen, 0);
  EXPECT_EQ(r.path[r.chosen].form, WireForm::kTransform);
  // The test split reports KL and top-1 agreement against exact KV beside the NLL; the selection
  // split (scored without a reference pass) does not.
  for (const PathPointResult& p : r.path) {
    EXPECT_TRUE(p.validation.kl.empty());
    if (!p.on_test()) continue;
    ASSERT_EQ(p.test.kl.size(), p.test.deltas.size());
    ASSERT_EQ(p.test.top1.size(), p.test.deltas.size());
    for (size_t i = 0; i < p.test.kl.size(); ++i) {
      EXPECT_GE(p.test.kl[i], 0.0);
      EXPECT_GE(p.test.top1[i], 0.0);
      EXPECT_LE(p.test.top1[i], 1.0);
    }
  }
  EXPECT_GT(r.path[r.chosen].test.MeanKl(), 0.0);  // coarse codes change the distribution

  const fs::path out = *dir_ / "transform";
  ASSERT_TRUE(WriteOutputs(r, out.string()).ok());
  auto bank = PredictorBank::Open((out / "bank.rkvbank").string(), "");
  ASSERT_TRUE(bank.ok()) << bank.status();
  ASSERT_NE((*bank)->transforms(), nullptr);
  EXPECT_EQ((*bank)->transform(3, true)->head[0].basis,
            r.transforms->transforms.layers[3][1].head[0].basis);
  auto policy = ReadPolicy((out / "policy.pb").string(), static_cast<int32_t>(n_layers), "");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->wire_form, "transform");
  EXPECT_EQ(policy->transform_step, 2.0);
  EXPECT_EQ(policy->transform_bytes_per_token, r.transforms->bytes_per_token);
  EXPECT_EQ(policy->predictor_bank_sha256, (*bank)->content_hash());
  EXPECT_TRUE(PolicyNeedsBank(*policy));
  std::ifstream json(out / "calibration.json");
  const std::string text((std::istreambuf_iterator<char>(json)), {});
  EXPECT_NE(text.find("\"transform\""), std::string::npos);
  const auto j = nlohmann::json::parse(text);
  EXPECT_DOUBLE_EQ(j["chosen"]["test"]["kl"].get<double>(), r.path[r.chosen].test.MeanKl());
  EXPECT_DOUBLE_EQ(j["chosen"]["test"]["top1"].get<double>(), r.path[r.chosen].test.MeanTop1());

  o.transform_step = 0.0;
  auto bad = Calibrate(*model_, "tiny", o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("--transform-step"), std::string::npos) << bad.status();
}

TEST_F(CalibrateTiny, GateDecidesAndExactFallbackWritesNoBank) {
  CalibrateOptions o = Quick();
  o.exhaustive = false;
  o.noise_requests = 0;
  o.epsilon = 0.0;
  o.gate = Gate::kStableSplit;
  auto res = Calibrate(*model_, "tiny", o);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(res->noise.empty());
  // The choice is Stable-split's rule applied to the path's own measurements: Upper-90 on the
  // selection requests and the mean on the confirmation requests both within budget, the fewest
  // bytes sent among those that pass (the first on a tie), else exact KV.
  int expect = -1;
  for (size_t k = 0; k < res->path.size(); ++k) {
    const auto& p = res->path[k];
    if (std::max(p.validation.upper90, p.confirm.ci95.mean) <= o.epsilon &&
        (expect < 0 || p.sent_fraction < res->path[expect].sent_fraction)) {
      expect = static_cast<int>(k);
    }
  }
  EXPECT_EQ(res->chosen, expect);
  EXPECT_EQ(res->gates[static_cast<int>(Gate::kStableSplit)].decision.chosen, expect);

  // Whatever this data gives, an exact fallback writes a policy that keeps every layer; its
  // ladder still rebuilds, with the exact anchors' fits: the plain points and every form's
  // k = 0 point are rungs, and the bank holds the groups of the longest.
  CalibrationResult exact = *std::move(res);
  exact.chosen = -1;
  const fs::path out = *dir_ / "exact";
  fs::create_directories(out);
  std::ofstream(out / "noise-control.svg") << "stale";
  ASSERT_TRUE(WriteOutputs(exact, out.string()).ok());
  EXPECT_FALSE(fs::exists(out / "noise-control.svg"));
  auto policy = ReadPolicy((out / "policy.pb").string(), 8, "");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->rebuilt_groups.size(), 0u);
  EXPECT_EQ(policy->kept_layers.size(), 8u);
  EXPECT_EQ(policy->kv_bytes_saved_per_token, 0);
  EXPECT_EQ(policy->gate, "stable-split");
  EXPECT_EQ(policy->test_delta_nll.mean, 0.0);
  EXPECT_EQ(policy->test_delta_nll.requests, 3);
  int32_t longest = 0;
  for (const RetentionPolicy::PathPoint& pt : policy->path) {
    EXPECT_EQ(pt.in_bank, pt.wire_form == "plain" || pt.groups == 0);
    if (pt.in_bank) longest = std::max(longest, pt.groups);
  }
  auto bank = PredictorBank::Open((out / "bank.rkvbank").string(), "");
  ASSERT_TRUE(bank.ok()) << bank.status();
  EXPECT_EQ((*bank)->content_hash(), policy->predictor_bank_sha256);
  EXPECT_EQ((*bank)->groups().size(), static_cast<size_t>(longest));

  // With no point measured there is no ladder: no bank (a stale one is removed).
  for (PathPointResult& pt : exact.path) pt.validation = {};
  ASSERT_TRUE(WriteOutputs(exact, out.string()).ok());
  EXPECT_FALSE(fs::exists(out / "bank.rkvbank"));
  policy = ReadPolicy((out / "policy.pb").string(), 8, "");
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_TRUE(policy->predictor_bank_sha256.empty());
  EXPECT_TRUE(policy->path.empty());
}

TEST_F(CalibrateTiny, BadOptionsFailBeforeAnyWork) {
  auto expect_error = [&](CalibrateOptions o, const char* needle) {
    auto res = Calibrate(*model_, "tiny", o);
    ASSERT_FALSE(res.ok()) << needle;
    EXPECT_EQ(res.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(res.status().message().find(needle), std::string_view::npos) << res.status();
  };
  CalibrateOptions o = Quick();
  o.history = 240;
  expect_error(o, "context");
  o = Quick();
  o.validation = 1;
  expect_error(o, "--validation");
  o = Quick();
  o.exhaustive_max_groups = 2;
  expect_error(o, "exhaustive");
  o = Quick();
  o.test = 400;
  expect_error(o, "test split");
  o = Quick();
  o.corpus[0].path = (*dir_ / "missing.txt").string();
  auto missing = Calibrate(*model_, "tiny", o);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing.txt"), std::string_view::npos);
  o = Quick();
  o.corpus[0].boundary = "^never$";
  expect_error(o, "document");
  o = Quick();
  o.groups = {{{3}, {2, 4}}, {{4}, {3, 5}}};  // layer 3 both rebuilt and an anchor
  auto overlap = Calibrate(*model_, "tiny", o);
  EXPECT_FALSE(overlap.ok());
  o = Quick();
  o.gate = Gate::kStableSplit;
  o.confirm = 0;
  expect_error(o, "stable-split");
  o = Quick();
  o.epsilon = std::nan("");
  expect_error(o, "epsilon");
}

// Two kinds of text: every set holds both, each kind's figures are its own requests' and the
// gates take the worst kind's statistic.
TEST_F(CalibrateTiny, KindsAreMeasuredAndGatedEachOnTheirOwn) {
  CalibrateOptions o = Quick();
  o.corpus.push_back({"other", (*dir_ / "other").string(), "^Doc "});
  o.validation = 6;
  o.confirm = 4;
  o.test = 5;
  o.exhaustive = false;
  o.noise_requests = 0;
  o.epsilon = 10.0;
  auto res = Calibrate(*model_, "tiny", o);
  ASSERT_TRUE(res.ok()) << res.status();
  const CalibrationResult& r = *res;
  ASSERT_EQ(r.kinds.size(), 2u);
  EXPECT_EQ(r.kinds[1].kind.name, "other");
  EXPECT_EQ(r.validation_kinds, std::vector<int>({0, 1, 0, 1, 0, 1}));  // alternating
  EXPECT_EQ(r.test_kinds, std::vector<int>({0, 1, 0, 1, 0}));           // 3 + 2
  EXPECT_EQ(r.kinds[0].splits[kTest].requests + r.kinds[1].splits[kTest].requests, 5);
  EXPECT_EQ(r.kinds[0].corpus.documents + r.kinds[1].corpus.documents, r.corpus.documents);
  EXPECT_EQ(r.kinds[1].corpus.documents, 300);  // each file cut on its own

  const BootstrapOptions boot{o.bootstrap_resamples, o.seed};
  const GateDecision& upper = r.gates[static_cast<int>(Gate::kUpper90)].decision;
  for (size_t k = 0; k < r.path.size(); ++k) {
    const PathPointResult& p = r.path[k];
    double worst = -INFINITY;
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<double> val, test;
      for (size_t i = 0; i < r.validation_kinds.size(); ++i) {
        if (r.validation_kinds[i] == kind) val.push_back(p.validation.deltas[i]);
      }
      for (size_t i = 0; i < r.test_kinds.size(); ++i) {
        if (r.test_kinds[i] == kind) test.push_back(p.test.deltas[i]);
      }
      const DeltaSummary& v = p.validation.by_kind[kind];
      const DeltaSummary& t = p.test.by_kind[kind];
      EXPECT_EQ(v.requests, static_cast<int>(val.size()));
      EXPECT_EQ(t.requests, static_cast<int>(test.size()));
      EXPECT_NEAR(v.ci95.mean, std::accumulate(val.begin(), val.end(), 0.0) / val.size(), 1e-12);
      EXPECT_NEAR(t.ci95.mean, std::accumulate(test.begin(), test.end(), 0.0) / test.size(), 1e-12);
      auto ub = BootstrapUpperBound(val, 0.9, boot);
      ASSERT_TRUE(ub.ok());
      EXPECT_EQ(v.upper90, *ub);
      worst = std::max(worst, *ub);
    }
    EXPECT_EQ(upper.statistic[k], worst) << "path point " << k;
  }

  // The JSON carries the same per-kind figures.
  const fs::path out = *dir_ / "kinds";
  ASSERT_TRUE(WriteOutputs(r, out.string()).ok());
  std::ifstream json_in(out / "calibration.json");
  auto j = nlohmann::json::parse(json_in, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  ASSERT_EQ(j["corpus"]["kinds"].size(), 2u);
  EXPECT_EQ(j["corpus"]["kinds"][1]["name"], "other");
  for (size_t k = 0; k < r.path.size(); ++k) {
    for (int kind = 0; kind < 2; ++kind) {
      const std::string name = r.kinds[kind].kind.name;
      const auto& jt = j["path"][k]["test"]["by_kind"][name];
      EXPECT_EQ(jt["mean"].get<double>(), r.path[k].test.by_kind[kind].ci95.mean);
      EXPECT_EQ(jt["requests"].get<int>(), r.path[k].test.by_kind[kind].requests);
      EXPECT_EQ(j["path"][k]["validation"]["by_kind"][name]["upper90"].get<double>(),
                r.path[k].validation.by_kind[kind].upper90);
    }
    EXPECT_EQ(j["path"][k]["gates"]["upper90"]["statistic"].get<double>(), upper.statistic[k]);
    EXPECT_EQ(j["path"][k]["gates"]["upper90"]["worst_kind"],
              r.kinds[upper.worst_kind[k]].kind.name);
  }
  std::ifstream html_in(out / "report.html");
  const std::string html((std::istreambuf_iterator<char>(html_in)), {});
  EXPECT_NE(html.find("By kind of text"), std::string::npos);
}

TEST_F(CalibrateTiny, BadKindsFailBeforeAnyWorkNamingTheKind) {
  auto expect_error = [&](CalibrateOptions o, absl::StatusCode code,
                          std::vector<std::string> needles) {
    o.quiet = true;
    auto res = Calibrate(*model_, "tiny", o);
    ASSERT_FALSE(res.ok()) << needles[0];
    EXPECT_EQ(res.status().code(), code) << res.status();
    for (const std::string& n : needles) {
      EXPECT_NE(res.status().message().find(n), std::string_view::npos) << res.status();
    }
  };
  CalibrateOptions o = Quick();
  o.corpus.push_back({"little", (*dir_ / "little.txt").string(), "^Doc "});
  o.validation = 4;
  o.test = 4;
  o.confirm = 4;
  expect_error(o, absl::StatusCode::kInvalidArgument, {"kind 'little'", "little.txt"});
  o.corpus[1] = {"text", (*dir_ / "other").string(), "^Doc "};
  expect_error(o, absl::StatusCode::kInvalidArgument, {"'text' named twice"});
  o.corpus[1] = {"gone", (*dir_ / "gone.txt").string(), "^Doc "};
  expect_error(o, absl::StatusCode::kNotFound, {"kind 'gone'", "gone.txt"});
  o.corpus[1] = {"other", (*dir_ / "other").string(), "^Doc "};
  o.test = 3;  // one test request for one of the two kinds
  expect_error(o, absl::StatusCode::kInvalidArgument, {"--test", "2 kinds"});
}

TEST_F(CalibrateTiny, OutputDirIsCheckedBeforeAnyWork) {
  const fs::path fresh = *dir_ / "check-out" / "nested";
  ASSERT_TRUE(CheckOutputDir(fresh.string()).ok());
  EXPECT_TRUE(fs::is_directory(fresh));
  EXPECT_TRUE(fs::is_empty(fresh)) << "the probe file is left behind";
  // A path under a regular file can be neither created nor written, even by root.
  const fs::path file = *dir_ / "check-out" / "a-file";
  std::ofstream(file) << "x";
  const absl::Status s = CheckOutputDir((file / "out").string());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("--out " + (file / "out").string()), std::string::npos) << s;
}

TEST(ParseGroupList, ReadsTargetsAndAnchors) {
  auto g = ParseGroupList("4-5:3,6;8:7,9");
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->size(), 2u);
  EXPECT_EQ((*g)[0].targets, std::vector<int32_t>({4, 5}));
  EXPECT_EQ((*g)[0].anchors, std::vector<int32_t>({3, 6}));
  EXPECT_EQ((*g)[1].targets, std::vector<int32_t>({8}));
  EXPECT_EQ((*g)[1].anchors, std::vector<int32_t>({7, 9}));
  EXPECT_TRUE(ParseGroupList("4-5:3,6;").ok());  // a trailing separator is harmless
  for (const char* bad : {"", "4-5", "a:1", "5-4:3,6", "4:3,,6", "4;;5:6", "4:-1", "4-:3"}) {
    EXPECT_FALSE(ParseGroupList(bad).ok()) << bad;
  }
}

// The Gaussian control's noise has the NRMSE it was asked for.
TEST(MatchedNoise, HasTheRequestedNrmse) {
  auto exact = KvCache::Create(2, 2, 16, 512, DType::kF32);
  ASSERT_TRUE(exact.ok());
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.5f, 2.0f);
  std::vector<float> rows(512 * 32);
  for (float& v : rows) v = n(rng);
  ASSERT_TRUE((*exact)->WriteKeys(1, 0, 512, rows.data()).ok());
  for (float& v : rows) v = n(rng);
  ASSERT_TRUE((*exact)->WriteValues(1, 0, 512, rows.data()).ok());
  ASSERT_TRUE((*exact)->SetTokens(512).ok());
  auto work = (*exact)->Clone();
  ASSERT_TRUE(work.ok());
  auto zero = LayerNrmse(**exact, **work, 1, 512);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->k, 0.0);
  EXPECT_EQ(zero->v, 0.0);
  ASSERT_TRUE(ReplaceWithMatchedNoise(**exact, **work, 1, 512, {0.1, 0.3}, 42).ok());
  auto e = LayerNrmse(**exact, **work, 1, 512);
  ASSERT_TRUE(e.ok());
  EXPECT_NEAR(e->k, 0.1, 0.005);  // 16384 values: relative spread ~0.6%
  EXPECT_NEAR(e->v, 0.3, 0.015);
  auto other = LayerNrmse(**exact, **work, 0, 512);  // layer 0 untouched
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->k, 0.0);
  EXPECT_FALSE(ReplaceWithMatchedNoise(**exact, **work, 1, 512, {-1.0, 0.1}, 1).ok());
}

}  // namespace
}  // namespace riskkv
