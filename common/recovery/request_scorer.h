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

  // Layer passes run by Score() so far, n_layers for a full pass.
  int64_t layers_run() const { return layers_run_; }

 private:
  RequestScorer(Model& model, const Request& request, Backend* backend)
      : model_(model), request_(request), backend_(backend) {}
  // Decodes the last history token over `cache` and scores the eval tokens, running layers
  // [first, n_layers) from stream[first] and saving each run layer's stream into `stream`.
  absl::StatusOr<double> Run(KvCache& cache, int64_t first, std::vector<float>& stream);
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
  double exact_nll_ = 0.0, previous_nll_ = 0.0;
  bool exact_scored_ = false;       // exact_stream_ and exact_nll_ are set
  bool has_previous_ = false;       // a configuration has been scored
  bool previous_is_exact_ = false;  // ... and it was the exact one
  bool pending_ = false;            // NextConfiguration() returned work_ and Score() has not run
  int64_t layers_run_ = 0;
};

}  // namespace riskkv
