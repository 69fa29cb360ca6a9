// The measuring half of RISK-KV calibration: requests cut from text, group predictors fitted on
// training requests, and the per-request teacher-forced NLL of evaluation tokens with any set of
// groups rebuilt, paired with the same request on exact KV.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model.h"
#include "common/recovery/folded_map.h"
#include "common/recovery/layer_group.h"

namespace riskkv {

// `history` tokens whose KV a migration moves, followed by `eval` tokens scored.
struct Request {
  std::vector<int32_t> tokens;
  int64_t history = 0;
};

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

// Per-request NLL of the eval tokens for each configuration. configs[c] lists indices into
// `groups` (the groups rebuilt over the history for that configuration; empty = exact KV).
// Returns nll[c][r], the mean NLL over request r's eval tokens. Every configuration of a request
// starts from the same exact prefill, so differences are paired.
absl::StatusOr<std::vector<std::vector<double>>> MeasureNll(
    Model& model, std::span<const Request> requests, std::span<const FoldedGroup> groups,
    std::span<const std::vector<int>> configs, const Progress& progress = {});

}  // namespace riskkv
