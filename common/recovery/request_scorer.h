// Scoring one calibration request under many configurations without rerunning what they share.
// Every configuration starts from the same exact prefill and changes only some layers' moved KV
// rows, so the layers below the lowest changed one see exactly the inputs of a pass already run:
// each pass saves the residual stream entering every layer for the scored tokens, and the next
// configuration starts at its lowest changed layer from the saved stream of the exact
// configuration (once it has been scored) or of the previous configuration, whichever agrees
// with it on more layers; with neither, it runs in full. The result is bit-identical to a full
// pass: the same ops on the same inputs, in the same batches.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/model/top_logprobs.h"

namespace riskkv {

// A session of `history` tokens when it migrates, followed by `eval` tokens scored. As in a
// migration, the KV rows of all but the last history token are what moves (and what a
// configuration rebuilds); the target then decodes the last history token over those rows, so
// every eval token, the first included, sees the configuration.
struct Request {
  std::vector<int32_t> tokens;
  int64_t history = 0;

  int64_t moved_rows() const { return history - 1; }
};

// The exact distribution's most likely tokens ScoredQuality::kl keeps apart (the vocabulary's
// size where it is smaller): the same as a node's Score reference (top_logprobs.h).
inline constexpr int64_t kKlTopTokens = kTopTokens;

// A configuration's eval tokens against the exact configuration's (llama.cpp's perplexity tool
// reports the same two divergences):
struct ScoredQuality {
  double nll = 0.0;  // the mean NLL of the eval tokens (what Score() returns)
  // The mean over eval positions of KL(exact || this) in nats, over the exact distribution's
  // kKlTopTokens most likely tokens, each on its own, and the rest of the vocabulary as one
  // outcome: a lower bound on the full KL, equal to it when the vocabulary is no larger.
  double kl = 0.0;
  // The share of eval positions whose most likely token (the lowest id among equals) is the
  // exact configuration's.
  double top1 = 1.0;
};

class RequestScorer {
 public:
  // Prefills the request's moved rows with exact KV. `model`, `request` and `backend` must
  // outlive the scorer; the request must have been checked (1 <= history < tokens, tokens within
  // the context). Every pass runs on `backend` (null: the model's; see ForwardOptions::backend).
  static absl::StatusOr<std::unique_ptr<RequestScorer>> Create(Model& model, const Request& request,
                                                               Backend* backend = nullptr);

  // The backend the passes run on.
  Backend& backend() { return backend_ != nullptr ? *backend_ : model_.backend(); }

  // The exact cache (moved rows only).
  const KvCache& exact() const { return *exact_; }

  // A cache holding a copy of exact(), for the caller to turn into a configuration's cache
  // (changing only moved rows) before calling Score().
  absl::StatusOr<KvCache*> NextConfiguration();
  // The mean NLL of the eval tokens over the cache NextConfiguration() returned: what a
  // migration target computes after receiving (and rebuilding) those rows.
  absl::StatusOr<double> Score();
  // Score() with the divergence from the exact configuration, which must have been scored first
  // by ScoreQuality (FailedPrecondition otherwise; Score() keeps no reference, so the NLL alone
  // costs no more than it did); the exact configuration itself has kl 0 and top1 1.
  absl::StatusOr<ScoredQuality> ScoreQuality();

  // Layer passes run by Score() so far, n_layers for a full pass.
  int64_t layers_run() const { return layers_run_; }

 private:
  RequestScorer(Model& model, const Request& request, Backend* backend)
      : model_(model), request_(request), backend_(backend) {}
  absl::StatusOr<ScoredQuality> ScoreAny(bool divergence);
  // Decodes the last history token over `cache` and scores the eval tokens, running layers
  // [first, n_layers) from stream[first] and saving each run layer's stream into `stream`. The
  // exact pass (`reference`) keeps each position's kKlTopTokens most likely tokens for the
  // divergences of later passes.
  absl::StatusOr<ScoredQuality> Run(KvCache& cache, int64_t first, std::vector<float>& stream,
                                    bool reference);
  // One position's NLL of `target`, and its divergence from the reference's position i (or, for
  // the reference, the position's top tokens saved).
  void ScorePosition(std::span<const float> logits, int32_t target, int64_t i, bool reference,
                     double* nll, double* kl, double* top1);
  // The lowest layer whose moved rows differ between a and b (n_layers when none does).
  int64_t FirstDifference(const KvCache& a, const KvCache& b) const;

  Model& model_;
  const Request& request_;
  Backend* backend_;
  int64_t scored_ = 0;  // positions run per pass: the last history token and the eval tokens
  std::unique_ptr<KvCache> exact_, work_, previous_;
  // Residual streams entering each layer, [n_layers, scored_, hidden]: of the exact pass and of
  // the last configuration scored.
  std::vector<float> exact_stream_, previous_stream_;
  ScoredQuality exact_quality_, previous_quality_;
  // The exact pass's kKlTopTokens most likely tokens at each eval position, most likely first
  // (the lowest id among equals), and their log-probabilities.
  std::vector<int32_t> reference_ids_;
  std::vector<float> reference_logp_;
  bool exact_scored_ = false;       // exact_stream_, exact_quality_ and the reference are set
  bool has_previous_ = false;       // a configuration has been scored
  bool previous_is_exact_ = false;  // ... and it was the exact one
  bool pending_ = false;            // NextConfiguration() returned work_ and Score() has not run
  int64_t layers_run_ = 0;
};

}  // namespace riskkv
