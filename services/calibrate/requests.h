// The request sets of a calibration, cut from each kind of text's own document splits so that
// no document is in two sets and every kind is represented in every set.
#pragma once

#include <array>
#include <vector>

#include "absl/status/statusor.h"
#include "common/recovery/request_scorer.h"
#include "common/tokenizer/tokenizer.h"
#include "services/calibrate/calibrate.h"

namespace riskkv {

enum RequestSet { kTrainSet = 0, kSelectionSet = 1, kConfirmSet = 2, kTestSet = 3 };

struct RequestSets {
  std::array<std::vector<Request>, 4> requests;
  std::array<std::vector<int>, 4> kinds;  // the kind of each request
};

// Reads every kind (every file is checked before any is tokenized), drops documents with little
// prose, assigns each kind's documents to train / validation / test by a seeded hash, and cuts
// each kind's share of every set (KindShare) from its split's documents in order: selection
// requests first, then confirmation requests from the validation documents after them. Within a
// set the kinds alternate (the first requests of a set cover every kind). Fills res->corpus,
// res->splits and res->kinds. Errors name the kind: a missing or unreadable file, too few
// documents, too little text for the requests asked.
absl::StatusOr<RequestSets> MakeRequestSets(const Tokenizer& tokenizer, const CalibrateOptions& o,
                                            CalibrationResult* res);

}  // namespace riskkv
