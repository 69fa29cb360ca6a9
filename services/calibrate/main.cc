// riskkv-calibrate: decides, for one model, which layers' KV a migration may omit and rebuild,
// and writes the retention policy, the predictor bank it needs and a report (see
// services/calibrate/calibrate.h for the method).
//   riskkv-calibrate --model M --out DIR            (SmolLM2: about 22 min of 2 cores)
//   riskkv-calibrate --model M --out DIR --quick    (a smoke run, about a minute)
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/model.h"
#include "services/calibrate/calibrate.h"
#include "services/cli_args.h"
#include "services/cli_help.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory (required)");
ABSL_FLAG(std::string, out, "",
          "output directory: policy.pb, policy.txt, bank.rkvbank, "
          "report.html, calibration.json (required)");
ABSL_FLAG(
    std::string, corpus, "",
    "kinds of text, KIND=PATH[,KIND=PATH...] (PATH: UTF-8 text, plain or gzip, or a directory "
    "of such files), or one PATH; default: lexicon (Jargon File), legal "
    "(/usr/share/common-licenses) and manual (Debian Reference)");
ABSL_FLAG(std::string, doc_boundary, "",
          "regular expression matching the first line of each document, for every kind (default: "
          "each default kind's own; the Jargon File's for KIND=PATH kinds)");
ABSL_FLAG(double, min_prose, 0.5,
          "drop documents with a smaller share of characters on lines of 40+ characters "
          "(indexes, word lists)");
ABSL_FLAG(double, train_fraction, 0.5, "share of documents in the train split");
ABSL_FLAG(double, validation_fraction, 0.25, "share in the validation split (test: the rest)");
ABSL_FLAG(bool, quick, false, "small sizes for tests and smoke runs (explicit flags still win)");
ABSL_FLAG(int64_t, history, 512, "history tokens per request (H)");
ABSL_FLAG(int64_t, eval_tokens, 512, "scored tokens per request (T)");
ABSL_FLAG(int, train, 64, "training requests");
ABSL_FLAG(int, validation, 24, "validation requests for ridge strength, risks, path and gates");
ABSL_FLAG(int, confirm, 0,
          "Stable-split requests, from validation-split documents the selection requests do not "
          "use (0: none; --full-report or --gate stable-split: 8)");
ABSL_FLAG(int, test, 24, "held-out test requests for the report");
ABSL_FLAG(int, noise_requests, 0,
          "validation requests of the Gaussian-noise control (0: skip; --full-report: 8)");
ABSL_FLAG(int, noise_draws, 1, "noise draws per request and group");
ABSL_FLAG(double, epsilon, 0.005, "budget on the mean NLL increase (nats per token)");
ABSL_FLAG(std::string, gate, "upper90", "quality gate: mean, upper90 or stable-split");
ABSL_FLAG(int, group_size, 2, "target layers per candidate group");
ABSL_FLAG(int, anchors_per_side, 1, "exact anchor layers on each side of a group");
ABSL_FLAG(std::string, groups, "", "explicit candidates instead, e.g. '4-5:3,6;8-9:7,10'");
ABSL_FLAG(bool, exhaustive, false, "also measure every subset of the candidates");
ABSL_FLAG(int, exhaustive_max_groups, 8, "refuse --exhaustive above this many candidates");
ABSL_FLAG(int, bootstrap, 2000, "bootstrap resamples");
ABSL_FLAG(std::string, bank_dtype, "f16", "folded map storage: f16 or f32");
ABSL_FLAG(std::string, kv_dtype, "f16", "KV dtype a migration sends (sizes the byte counts)");
ABSL_FLAG(std::string, policy_id, "", "policy id (default: from the model name)");
ABSL_FLAG(uint64_t, policy_version, 1, "policy version");
ABSL_FLAG(uint64_t, seed, 1, "document assignment, bootstrap and noise seed");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(
    std::string, activations, "int8",
    "int8 (what nodes serve with by default) or f32: the arithmetic every NLL is measured in");
ABSL_FLAG(std::string, wire_forms, "int8,int4",
          "wire forms of the kept layers to measure and choose among (comma-separated: plain, "
          "int8, int4, transform; --full-report: plain, int8 and int4 when not given)");
ABSL_FLAG(std::string, transform, "pca",
          "the transform form's transform, fitted to the training histories: pca, hadamard or "
          "identity");
ABSL_FLAG(double, transform_step, 0.25,
          "the transform form's step as a share of each layer's RMS (larger: fewer bytes, more "
          "damage)");
ABSL_FLAG(std::string, test_points, "chosen",
          "path points scored on the held-out test split: chosen (each gate's and budget's "
          "choice and each form's FULL_KV point) or all (--full-report)");
ABSL_FLAG(std::string, path_points, "needed",
          "path points measured on the selection requests: needed (the wire forms in turn, "
          "skipping points that send more bytes than one that passes every gate at every reported "
          "budget) or all (--full-report, and whenever --confirm or --exhaustive is on)");
ABSL_FLAG(bool, full_report, false,
          "also measure what only the report reads: the plain form's path, 8 confirmation "
          "requests (the Stable-split gate), the noise control on 8 requests and every path "
          "point on the selection and the test split (explicit flags still win)");
ABSL_FLAG(std::string, fit_anchors, "wire",
          "wire: each quantized form's predictors fitted on its decoded anchors (joint "
          "calibration); exact: one fit on exact anchors for every form");
ABSL_FLAG(bool, quiet, false, "no progress bars");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "riskkv-calibrate: %s\n", s.ToString().c_str());
  return 1;
}

// The normalised command line, to tell flags given explicitly from defaults.
std::vector<std::string> g_args;

bool Given(const std::string& name) {
  for (const std::string& a : g_args) {
    if (a == "--") break;
    for (const std::string& form : {"--" + name, "-" + name}) {
      if (a == form || a.rfind(form + "=", 0) == 0) return true;
    }
  }
  return false;
}

absl::StatusOr<riskkv::CalibrateOptions> OptionsFromFlags() {
  riskkv::CalibrateOptions o;
  const std::string boundary = absl::GetFlag(FLAGS_doc_boundary);
  if (const std::string spec = absl::GetFlag(FLAGS_corpus); !spec.empty()) {
    auto kinds = riskkv::ParseCorpusSpec(spec, riskkv::kJargonBoundary);
    if (!kinds.ok()) return kinds.status();
    o.corpus = *kinds;
  }
  if (!boundary.empty()) {
    for (riskkv::CorpusKind& k : o.corpus) k.boundary = boundary;
  }
  // Quick sizes are per kind of text, so the kinds come first.
  if (absl::GetFlag(FLAGS_quick)) o.MakeQuick();
  o.min_prose = absl::GetFlag(FLAGS_min_prose);
  o.fractions = {absl::GetFlag(FLAGS_train_fraction), absl::GetFlag(FLAGS_validation_fraction)};
  auto take = [](const char* name, auto flag_value, auto* field) {
    if (!absl::GetFlag(FLAGS_quick) || Given(name)) *field = flag_value;
  };
  take("history", absl::GetFlag(FLAGS_history), &o.history);
  take("eval_tokens", absl::GetFlag(FLAGS_eval_tokens), &o.eval);
  take("train", absl::GetFlag(FLAGS_train), &o.train);
  take("validation", absl::GetFlag(FLAGS_validation), &o.validation);
  // --full-report's diagnostics, each unless its own flag is given.
  const bool full = absl::GetFlag(FLAGS_full_report);
  auto diagnostic = [&](const char* name, auto flag_value, auto full_value, auto* field) {
    if (Given(name)) {
      *field = flag_value;
    } else if (!absl::GetFlag(FLAGS_quick)) {
      *field = full ? full_value : flag_value;
    }
  };
  diagnostic("confirm", absl::GetFlag(FLAGS_confirm), 8, &o.confirm);
  // The Stable-split gate decides on confirmation requests: it gets --full-report's 8 when
  // --confirm is not given.
  if (absl::GetFlag(FLAGS_gate) == "stable-split" && !Given("confirm") &&
      !absl::GetFlag(FLAGS_quick)) {
    o.confirm = 8;
  }
  take("test", absl::GetFlag(FLAGS_test), &o.test);
  diagnostic("noise_requests", absl::GetFlag(FLAGS_noise_requests), 8, &o.noise_requests);
  take("noise_draws", absl::GetFlag(FLAGS_noise_draws), &o.noise_draws);
  take("bootstrap", absl::GetFlag(FLAGS_bootstrap), &o.bootstrap_resamples);
  o.epsilon = absl::GetFlag(FLAGS_epsilon);
  const std::string gate = absl::GetFlag(FLAGS_gate);
  if (gate == "mean") {
    o.gate = riskkv::Gate::kMean;
  } else if (gate == "upper90") {
    o.gate = riskkv::Gate::kUpper90;
  } else if (gate == "stable-split") {
    o.gate = riskkv::Gate::kStableSplit;
  } else {
    return absl::InvalidArgumentError("--gate must be mean, upper90 or stable-split, got '" + gate +
                                      "'");
  }
  o.rule.group_size = absl::GetFlag(FLAGS_group_size);
  o.rule.anchors_per_side = absl::GetFlag(FLAGS_anchors_per_side);
  if (const std::string g = absl::GetFlag(FLAGS_groups); !g.empty()) {
    auto groups = riskkv::ParseGroupList(g);
    if (!groups.ok()) return groups.status();
    o.groups = *groups;
  }
  o.exhaustive = absl::GetFlag(FLAGS_exhaustive);
  o.exhaustive_max_groups = absl::GetFlag(FLAGS_exhaustive_max_groups);
  auto bank = riskkv::FloatDTypeFromFlag("bank-dtype", absl::GetFlag(FLAGS_bank_dtype));
  if (!bank.ok()) return bank.status();
  o.bank_dtype = *bank;
  auto kv = riskkv::FloatDTypeFromFlag("kv-dtype", absl::GetFlag(FLAGS_kv_dtype));
  if (!kv.ok()) return kv.status();
  o.kv_dtype = *kv;
  o.wire_forms.clear();
  const std::string forms =
      full && !Given("wire_forms") ? "plain,int8,int4" : absl::GetFlag(FLAGS_wire_forms);
  for (absl::string_view name : absl::StrSplit(forms, ',')) {
    auto form = riskkv::ParseWireForm(std::string_view(name.data(), name.size()));
    if (!form.ok()) return form.status();
    o.wire_forms.push_back(*form);
  }
  auto kind = riskkv::ParseTransformKind(absl::GetFlag(FLAGS_transform));
  if (!kind.ok()) return kind.status();
  o.transform_kind = *kind;
  o.transform_step = absl::GetFlag(FLAGS_transform_step);
  // A two-valued flag: whether it holds `first` (else `second`), or an error naming it.
  auto either = [](const char* flag, const std::string& value, const char* first,
                   const char* second) -> absl::StatusOr<bool> {
    if (value != first && value != second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " must be ", first, " or ", second, ", not '", value, "'"));
    }
    return value == first;
  };
  auto fit_on_wire = either("fit-anchors", absl::GetFlag(FLAGS_fit_anchors), "wire", "exact");
  if (!fit_on_wire.ok()) return fit_on_wire.status();
  o.fit_on_wire = *fit_on_wire;
  auto test_chosen = either(
      "test-points", full && !Given("test_points") ? "all" : absl::GetFlag(FLAGS_test_points),
      "chosen", "all");
  if (!test_chosen.ok()) return test_chosen.status();
  o.test_every_point = !*test_chosen;
  auto path_needed = either(
      "path-points", full && !Given("path_points") ? "all" : absl::GetFlag(FLAGS_path_points),
      "needed", "all");
  if (!path_needed.ok()) return path_needed.status();
  o.path_every_point = !*path_needed;
  o.policy_id = absl::GetFlag(FLAGS_policy_id);
  o.policy_version = absl::GetFlag(FLAGS_policy_version);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.quiet = absl::GetFlag(FLAGS_quiet);
  if (auto s = o.Validate(); !s.ok()) return s;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-calibrate --model PATH --out DIR [--quick] [--epsilon 0.005] [--gate upper90]");
  std::vector<std::string> store;
  riskkv::ExitOnHelp(argc, argv);
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  g_args = store;
  const std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() > 1) {
    return Fail(absl::InvalidArgumentError(std::string("unexpected argument '") + rest[1] + "'"));
  }
  const std::string model_path = absl::GetFlag(FLAGS_model), out = absl::GetFlag(FLAGS_out);
  if (model_path.empty()) return Fail(absl::InvalidArgumentError("--model is required"));
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  auto options = OptionsFromFlags();
  if (!options.ok()) return Fail(options.status());
  if (absl::Status s = riskkv::CheckOutputDir(out); !s.ok()) return Fail(s);
  auto model_options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!model_options.ok()) return Fail(model_options.status());
  auto model = riskkv::Model::Load(model_path, *model_options);
  if (!model.ok()) return Fail(model.status());
  auto result = riskkv::Calibrate(**model, model_path, *options);
  if (!result.ok()) return Fail(result.status());
  if (auto s = riskkv::WriteOutputs(*result, out); !s.ok()) return Fail(s);

  const riskkv::CalibrationResult& r = *result;
  const riskkv::Measured& t = r.chosen >= 0 ? r.path[r.chosen].test : r.test_exact;
  std::printf("%s gate at epsilon %g: ", riskkv::GateName(options->gate), options->epsilon);
  if (r.chosen >= 0) {
    const riskkv::PathPointResult& p = r.path[r.chosen];
    std::printf(
        "rebuild %d of %lld layers, send the others %s: %.1f%% of FULL_KV's bytes (%s "
        "arithmetic)\n",
        p.layers, static_cast<long long>(r.config.n_layers),
        std::string(riskkv::WireFormName(p.form)).c_str(), 100 * p.sent_fraction,
        r.arithmetic.c_str());
  } else {
    std::printf("nothing passes; every layer kept exact\n");
  }
  std::printf(
      "held-out test (%zu requests): dNLL %+.5f [%+.5f, %+.5f], dPPL %+.3f%%, KL %.5f, top-1 "
      "%.2f%%\n",
      t.deltas.size(), t.ci95.mean, t.ci95.lo, t.ci95.hi, 100.0 * (std::exp(t.ci95.mean) - 1.0),
      t.MeanKl(), 100.0 * t.MeanTop1());
  const riskkv::Measured& v = r.chosen >= 0 ? r.path[r.chosen].validation : r.test_exact;
  for (size_t k = 0; k < r.kinds.size() && r.kinds.size() > 1; ++k) {
    const riskkv::DeltaSummary& kt = t.by_kind[k];
    std::printf("  %-12s test (%d): dNLL %+.5f [%+.5f, %+.5f]", r.kinds[k].kind.name.c_str(),
                kt.requests, kt.ci95.mean, kt.ci95.lo, kt.ci95.hi);
    if (r.chosen >= 0) {
      const riskkv::DeltaSummary& kv = v.by_kind[k];
      std::printf("; selection (%d): %+.5f [%+.5f, %+.5f], upper-90 %+.5f", kv.requests,
                  kv.ci95.mean, kv.ci95.lo, kv.ci95.hi, kv.upper90);
    }
    std::printf("\n");
  }
  std::printf("wrote %s/{policy.pb,policy.txt,%sreport.html,calibration.json,*.svg}\n", out.c_str(),
              r.ChosenGroups().empty() ? "" : "bank.rkvbank,");
  return 0;
}
