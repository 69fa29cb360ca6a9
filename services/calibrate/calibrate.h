// riskkv-calibrate's pipeline: from a model and a text corpus to a retention policy, the
// predictor bank it needs and a report, following RISK-KV's offline selection:
//   1. split each kind of text of the corpus by document into train / validation / test;
//   2. fit every candidate group's folded predictor on training histories (ridge strength
//      chosen on validation histories);
//   3. measure each group's singleton risk on validation requests and rank the groups;
//   4. measure the joint configurations along the ranking (G more evaluations per wire form: the
//      kept layers sent plain, int8, int4 or transform-coded, the rebuilt ones predicted from
//      those anchors), on
//      validation requests and on independent confirmation requests from the same split;
//   5. choose with the quality gate on the worst kind of text (the passing configuration that
//      sends the fewest bytes, else exact KV);
//   6. report the chosen configurations (or every one of the path) on the held-out test
//      requests, the Gaussian-noise control, and (for small G) the exhaustive search the path
//      stands in for.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcodec/kv_transform.h"
#include "common/kvcodec/wire_form.h"
#include "common/model/model.h"
#include "common/recovery/calibration.h"
#include "common/recovery/folded_map.h"
#include "common/recovery/layer_group.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/quality_gate.h"
#include "common/recovery/retention_policy.h"
#include "services/calibrate/corpus.h"
#include "services/calibrate/corpus_kinds.h"

namespace riskkv {

struct CalibrateOptions {
  std::vector<CorpusKind> corpus = DefaultCorpus();  // each kind split by document on its own
  double min_prose = 0.5;  // drop documents with less running prose (see ProseFraction)
  SplitFractions fractions;
  uint64_t seed = 1;  // document assignment, bootstrap and noise draws

  // Request counts are totals over the kinds of text, shared out evenly (KindShare).
  int64_t history = 512;   // H
  int64_t eval = 512;      // T
  int train = 64;          // requests fitting the predictors (train split)
  int validation = 24;     // requests choosing ridge strength, ranking and path (validation split)
  int confirm = 0;         // independent requests for Stable-split (validation split)
  int test = 24;           // held-out requests for the report (test split)
  int noise_requests = 0;  // validation requests of the Gaussian-noise control (0: skip)
  int noise_draws = 1;     // noise draws per request and group

  double epsilon = 0.005;
  Gate gate = Gate::kUpper90;
  GroupRule rule;
  std::vector<LayerGroup> groups;  // explicit candidates; empty: generated from `rule`
  bool exhaustive = false;         // also measure every subset of the candidates
  int exhaustive_max_groups = 8;   // refuse the exhaustive search above this many candidates
  int bootstrap_resamples = 2000;

  DType bank_dtype = DType::kF16;  // storage of the folded maps
  DType kv_dtype = DType::kF16;    // KV dtype a migration sends; sizes the byte counts
  // The wire forms whose paths are measured and among which the gate chooses.
  // Plain is left out by default: its points send at least as many bytes as int8's.
  std::vector<WireForm> wire_forms = {WireForm::kInt8, WireForm::kInt4};
  // The transform form's transforms (fitted to the training histories' moved rows) and step
  // ratio (transform_codec.h TransformStep), when wire_forms names it.
  TransformKind transform_kind = TransformKind::kPca;
  double transform_step = 0.25;
  // Each quantized form's predictors fitted on the anchors decoded from that form (joint
  // calibration); false: every form rebuilds with the predictors fitted on exact anchors.
  bool fit_on_wire = true;
  // Path points scored on the test requests: every one, or (false) those the decision is read
  // from: each gate's choice, the choices with and without reconstruction at every reported
  // budget, and each quantized form's FULL_KV point (k = 0).
  bool test_every_point = false;
  // Path points measured on the selection requests: every one, or (false, without confirmation
  // requests or the exhaustive search, which read every point) the wire forms in turn, the most
  // compact first, skipping each point that sends more bytes than one already measured that passes
  // the Mean and Upper-90 gates at every reported budget (a FULL_KV point: than a FULL_KV point
  // that passes, as the choice without reconstruction is made among those alone): no gate at
  // any of those budgets can choose it.
  bool path_every_point = false;
  std::string policy_id;
  uint64_t policy_version = 1;
  bool quiet = false;  // no progress bars

  // Small sizes for tests and smoke runs.
  void MakeQuick();
  absl::Status Validate() const;
};

// The requests of kind `kind` (of n_kinds) among `total` requests: total / n_kinds, one more
// for the first total % n_kinds kinds.
int KindShare(int total, int n_kinds, int kind);

// Summaries of per-request NLL increases.
struct DeltaSummary {
  Interval ci95;
  double upper90 = 0.0;
  double exact_nll = 0.0;    // mean over requests, exact KV
  double rebuilt_nll = 0.0;  // mean over requests, this configuration
  int violations = 0;        // requests whose delta exceeds epsilon
  int requests = 0;
};

// Per-request NLL increases of one configuration on one set of requests, with their summaries,
// over all requests and for each kind of text alone.
struct Measured : DeltaSummary {
  std::vector<double> deltas;
  std::vector<DeltaSummary> by_kind;  // indexed like CalibrationResult::kinds
  // Per request where measured against exact KV (the test and confirmation splits; empty on the
  // selection split): mean KL(exact || this) over the scored tokens, a lower bound on the full
  // KL, and top-1 agreement (request_scorer.h ScoredQuality).
  std::vector<double> kl, top1;
  double MeanKl() const;
  double MeanTop1() const;
};

struct PathPointResult {
  WireForm form = WireForm::kPlain;  // of the kept layers
  std::vector<int> groups;  // indices into CalibrationResult::groups: the ranking's first k
  std::vector<int32_t> kept_layers;  // the others, ascending
  int layers = 0;                    // rebuilt layers
  double kv_fraction = 0.0;          // of the layers, rebuilt
  double sent_fraction = 1.0;        // bytes sent, as a share of FULL_KV plain at kv_dtype
  // validation.requests == 0: not measured (dominated, see path_every_point);
  // test.requests == 0: not scored on the test requests.
  Measured validation, confirm, test;
  bool on_selection() const { return validation.requests > 0; }
  bool on_test() const { return test.requests > 0; }
};

// Budgets (nats per token) the report also shows the gate's choice at: about 0.5% and 1% PPL.
inline constexpr double kReportBudgets[] = {0.005, 0.01};

struct GateResult {
  Gate gate = Gate::kUpper90;
  GateDecision decision;  // over the path points
};

// What the gate chooses at another budget, from the same measurements: with reconstruction (any
// path point) and without (the k = 0 points: FULL_KV in each wire form).
struct BudgetResult {
  double epsilon = 0.0;
  int with_reconstruction = -1;     // path index; -1: exact KV
  int without_reconstruction = -1;  // path index of a k = 0 point; -1: exact KV
};

struct NoiseResult {
  int group = 0;
  double rebuilt_mean = 0.0;  // singleton delta on the same requests
  double noise_mean = 0.0;    // Gaussian replacement of matched NRMSE
  Interval rebuilt_ci95;      // paired bootstrap intervals over the requests
  Interval noise_ci95;        // (noise: per request, averaged over the draws)
  double nrmse_k = 0.0;       // mean over requests and target layers
  double nrmse_v = 0.0;
};

struct ExhaustiveResult {
  uint32_t mask = 0;  // bit g: group g rebuilt
  int layers = 0;
  double kv_fraction = 0.0;
  double mean = 0.0;
  double upper90 = 0.0;
};

struct StorageResult {
  int64_t unfolded_bytes = 0;    // ridge predictors to the attention input, f32
  int64_t folded_f32_bytes = 0;  // folded K/V maps, f32
  int64_t folded_f16_bytes = 0;  // folded K/V maps, f16 matrices and f32 offsets
};

struct CorpusStats {
  int64_t documents = 0;  // cut by the boundary pattern
  int64_t dropped = 0;    // below min_prose
};

struct SplitStats {
  int64_t documents = 0;
  int64_t documents_used = 0;
  int64_t tokens = 0;
  int requests = 0;
};

// One kind of text: its source, documents and what each split gave.
struct KindStats {
  CorpusKind kind;
  CorpusStats corpus;
  std::array<SplitStats, 3> splits;
};

struct CalibrationResult {
  CalibrateOptions options;
  std::string model_path;
  ModelConfig config;
  std::string fingerprint;
  CorpusStats corpus;                // totals over the kinds
  std::array<SplitStats, 3> splits;  // totals over the kinds
  std::vector<KindStats> kinds;
  // The kind of each selection, confirmation and test request (indices into kinds).
  std::vector<int> validation_kinds, confirm_kinds, test_kinds;

  std::vector<LayerGroup> groups;  // candidates
  std::vector<GroupFit> fits;      // parallel to groups, fitted on exact anchors
  // With options.fit_on_wire, indexed by WireForm: each measured quantized form's fits from its
  // decoded anchors, parallel to groups; empty for the others, which use `fits`.
  std::array<std::vector<GroupFit>, kWireFormCount> wire_fits;
  // The transform form's transforms and measured bytes, when options.wire_forms names it.
  std::optional<WireTransformFit> transforms;
  std::vector<Measured> singleton;  // parallel to groups, on validation requests
  std::vector<int> ranking;         // group indices, least risky first
  // For each wire form in options.wire_forms, in order: the points rebuilding the first k ranked
  // groups, k = 1..G for plain (k = 0 is exact KV) and k = 0..G for the quantized forms.
  std::vector<PathPointResult> path;
  std::string arithmetic;             // the model's activation precision: "int8" or "f32"
  std::array<GateResult, 3> gates;    // kMean, kUpper90, kStableSplit
  int chosen = -1;                    // path index chosen by options.gate; -1: exact KV
  std::vector<BudgetResult> budgets;  // options.gate at options.epsilon and at kReportBudgets
  Measured test_exact;                // exact KV on the test requests (deltas all zero)
  std::vector<int> test_points;       // path indices scored on the test requests, ascending

  std::vector<NoiseResult> noise;            // empty when skipped
  double noise_rank_correlation = 0.0;       // Spearman, noise vs rebuilt singleton risk
  std::vector<ExhaustiveResult> exhaustive;  // empty unless requested

  std::vector<StorageResult> storage;  // parallel to groups
  int64_t kv_bytes_per_token = 0;      // every layer, K and V, at kv_dtype
  std::vector<std::pair<std::string, double>> phase_seconds;

  // Layers rebuilt by the chosen configuration (ascending), and its groups sorted by layer.
  std::vector<LayerGroup> ChosenGroups() const;
  // The fits a configuration sending its kept layers in `form` rebuilds with.
  const std::vector<GroupFit>& FitsFor(WireForm form) const;
};

// Parses an explicit candidate list: groups separated by ';', each "TARGETS:ANCHORS" where
// TARGETS is "a" or "a-b" and ANCHORS a comma-separated list, e.g. "4-5:3,6;8:7,9".
absl::StatusOr<std::vector<LayerGroup>> ParseGroupList(const std::string& text);

// Runs steps 1-6. `model` must have been loaded from `model_path` (named in the report).
absl::StatusOr<CalibrationResult> Calibrate(Model& model, const std::string& model_path,
                                            const CalibrateOptions& options);

// The retention policy for the chosen configuration, its path points marked in_bank when they are
// rungs (InBank); bank_sha256 is the content hash of MakePolicyBank's bank (empty without one).
RetentionPolicy MakePolicy(const CalibrationResult& result, const std::string& bank_sha256);

// Whether path point k is a rung of the policy's ladder (policy_ladder.h): measured on the
// selection requests, and its predictors and transforms are those the bank holds. The bank holds
// one set of fits, the chosen configuration's form's (the exact anchors' when exact KV is
// chosen): a point rebuilding groups in a form fitted on other anchors is not a rung.
bool InBank(const CalibrationResult& result, size_t k);

// The bank of the ladder: the groups of every rung (the ranking's first groups, as many as the
// longest rung rebuilds) in the chosen form's fits, and the transforms when the transform form
// was calibrated; nullptr when neither.
absl::StatusOr<std::unique_ptr<PredictorBank>> MakePolicyBank(const CalibrationResult& result);

// Writes into `dir` (created when missing): policy.pb (binary), policy.txt (text format),
// bank.rkvbank (when a rung of the ladder rebuilds or sends the transform form), report.html,
// calibration.json and the report's charts as layers.svg, singleton-risk.svg, ordered-path.svg and,
// when the control ran, noise-control.svg.
absl::Status WriteOutputs(const CalibrationResult& result, const std::string& dir);

// Whether WriteOutputs can write into `dir`: creates it when missing and writes and removes a
// probe file, so that a calibration refuses an unwritable --out before it starts, not after.
absl::Status CheckOutputDir(const std::string& dir);

}  // namespace riskkv
