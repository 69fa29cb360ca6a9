// The measuring half of RISK-KV calibration: requests cut from text, group predictors fitted on
// training requests, and the per-request teacher-forced NLL of evaluation tokens with any set of
// groups rebuilt, paired with the same request on exact KV.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcodec/wire_form.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/recovery/folded_map.h"
#include "common/recovery/layer_group.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/request_scorer.h"
#include "common/recovery/wire_apply.h"

namespace riskkv {

// Cuts consecutive, non-overlapping windows of history + eval tokens (at most max_requests; 0
// means as many as fit).
std::vector<Request> MakeRequests(std::span<const int32_t> tokens, int64_t history, int64_t eval,
                                  int64_t max_requests);

// Called with (done, total) as work advances.
using Progress = std::function<void(int64_t done, int64_t total)>;

// Fits every group on the histories of `train` (ridge lambda chosen on `validation`), from the
// exact KV of the anchors to each target's normalised attention input, folded into the
// target's K/V projections.
absl::StatusOr<std::vector<GroupFit>> FitGroups(Model& model, std::span<const Request> train,
                                                std::span<const Request> validation,
                                                std::span<const LayerGroup> groups,
                                                const Progress& progress = {});

// FitGroups once per anchor form, sharing each request's forward pass: fits[f] predicts from the
// anchors as a target holds them after a migration that sent them in forms[f] (kPlain: exact),
// so a coded form's predictors are fitted on its decoded anchors (joint calibration of the
// wire form and the reconstruction). The targets are always the exact attention inputs. The
// transform form needs `transforms` (ApplyWireForm's).
absl::StatusOr<std::vector<std::vector<GroupFit>>> FitGroupsForForms(
    Model& model, std::span<const Request> train, std::span<const Request> validation,
    std::span<const LayerGroup> groups, std::span<const WireForm> forms,
    const Progress& progress = {}, const WireTransforms* transforms = nullptr);

// The transform codec's transforms of a model (transform_codec.h), as the calibration fits them.
struct WireTransformFit {
  BankTransforms transforms;
  // Mean bytes of one layer's keys and values per moved row in the transform form at the step
  // ratio asked for: what its migrations are estimated to send.
  double bytes_per_token = 0.0;
  int64_t rows = 0;       // moved rows the transforms were fitted to, per layer
  int64_t byte_rows = 0;  // moved rows bytes_per_token was measured on, per layer
};

// Fits a transform of `kind` to every layer's keys and values over the moved rows of `train`'s
// histories, the first (the attention sink, which crosses in f16) left out; then codes the moved
// rows of up to `byte_requests` of them in the transform form at step_ratio, as ApplyWireForm
// does, for bytes_per_token. Progress counts the forward passes. InvalidArgument for no requests,
// a step ratio that is not a finite number > 0, and FitTransform's refusals.
absl::StatusOr<WireTransformFit> FitWireTransforms(Model& model, std::span<const Request> train,
                                                   TransformKind kind, double step_ratio,
                                                   int byte_requests = 8,
                                                   const Progress& progress = {});

// Per-request NLL of the eval tokens for each configuration. configs[c] lists indices into
// `groups` (the groups rebuilt over the history for that configuration; empty = exact KV).
// Returns nll[c][r], the mean NLL over request r's eval tokens. Every configuration of a request
// starts from the same exact prefill, so differences are paired; each pass starts at the lowest
// layer the configuration changes (see RequestScorer), bit-identical to a full pass. On the CPU
// backend with T > 1 threads, min(T, kMaxRequestsAtOnce, requests) requests are scored at once,
// each on its own backend of the same arithmetic with its share of the T threads: the same
// numbers as one request at a time on T threads, since no op's result depends on the thread
// count, with less of the work waiting on the slowest thread. Each request in flight holds its
// scorer's caches and residual streams (about 0.26 GB for SmolLM2 at 1,024 tokens).
absl::StatusOr<std::vector<std::vector<double>>> MeasureNll(
    Model& model, std::span<const Request> requests, std::span<const FoldedGroup> groups,
    std::span<const std::vector<int>> configs, const Progress& progress = {});

// Turns `work` (holding a copy of request `request`'s exact KV for its moved_rows()) into
// configuration `config`'s cache; `exact` is the untouched original and `backend` the one the
// request is scored on (for any rebuild). Called for different requests at once: it must be safe
// to run concurrently on different `work` caches.
using ApplyConfig = std::function<absl::Status(size_t config, size_t request, const KvCache& exact,
                                               KvCache& work, Backend& backend)>;

// Requests MeasureNll and MeasureNllWith score at once, at most.
inline constexpr size_t kMaxRequestsAtOnce = 4;

// The general form of MeasureNll: n_configs configurations, each made by `apply`.
absl::StatusOr<std::vector<std::vector<double>>> MeasureNllWith(Model& model,
                                                                std::span<const Request> requests,
                                                                size_t n_configs,
                                                                const ApplyConfig& apply,
                                                                const Progress& progress = {});

// MeasureNllWith with each configuration's divergence from configuration 0, which must leave
// the exact KV as it is (ScoredQuality, request_scorer.h): [config][request] each.
struct QualityTable {
  std::vector<std::vector<double>> nll, kl, top1;
};
absl::StatusOr<QualityTable> MeasureQualityWith(Model& model, std::span<const Request> requests,
                                                size_t n_configs, const ApplyConfig& apply,
                                                const Progress& progress = {});

// Normalised RMS error of a layer's K and V rows [0, count) in `approx` against `exact`:
// ||approx - exact|| / ||exact|| (Frobenius), K and V separately (+inf when exact is all zeros
// and approx is not).
struct KvError {
  double k = 0.0;
  double v = 0.0;
};
absl::StatusOr<KvError> LayerNrmse(const KvCache& exact, const KvCache& approx, int64_t layer,
                                   int64_t count);

// Replaces a layer's rows [0, count) in `cache` by `exact` plus isotropic Gaussian noise whose
// NRMSE against `exact` is `error` (K and V separately, in expectation): the control that
// separates the size of a reconstruction error from its direction.
absl::Status ReplaceWithMatchedNoise(const KvCache& exact, KvCache& cache, int64_t layer,
                                     int64_t count, const KvError& error, uint64_t seed);

}  // namespace riskkv
