// Held-out requests for the KV benchmarks: each file of plain text tokenized and cut into
// requests of history + scored tokens, and which file each request came from.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "common/recovery/calibration.h"

namespace riskkv::bench {

// The contents of a file; NotFound naming it when it cannot be read.
inline absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError("cannot read " + path);
  return text.str();
}

struct EvalRequests {
  std::vector<Request> requests;
  std::vector<size_t> file_of;  // the index in `paths` of each request's file
};

// `per_file` requests of `history` + `tokens` tokens from each of `paths`, in order.
// InvalidArgument naming the file that holds fewer.
inline absl::StatusOr<EvalRequests> CutEvalRequests(Model& model,
                                                    const std::vector<std::string>& paths,
                                                    int64_t history, int64_t tokens,
                                                    int64_t per_file) {
  EvalRequests out;
  for (size_t f = 0; f < paths.size(); ++f) {
    absl::StatusOr<std::string> text = ReadTextFile(paths[f]);
    if (!text.ok()) return text.status();
    auto ids = model.tokenizer().Encode(*text, /*add_special=*/true, false);
    if (!ids.ok()) return ids.status();
    std::vector<Request> r = MakeRequests(*ids, history, tokens, per_file);
    if (static_cast<int64_t>(r.size()) < per_file) {
      return absl::InvalidArgumentError(paths[f] + " holds " + std::to_string(r.size()) +
                                        " requests, not " + std::to_string(per_file));
    }
    for (Request& q : r) {
      out.requests.push_back(std::move(q));
      out.file_of.push_back(f);
    }
  }
  return out;
}

}  // namespace riskkv::bench
