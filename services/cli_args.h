// Command-line spelling shared by the binaries: "--tokens-file" and "--tokens_file" both name
// the absl flag tokens_file, so flags read the same as the documentation in either form.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace riskkv {

// Rewrites dashes inside flag names to underscores ("--a-b=c-d" -> "--a_b=c-d"), leaving values
// and positional arguments alone. Call before absl::ParseCommandLine; the strings live in *store.
inline std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>* store) {
  store->assign(argv, argv + argc);
  for (size_t i = 1; i < store->size(); ++i) {
    std::string& a = (*store)[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    const size_t start = a.find_first_not_of('-');
    const size_t end = std::min(a.find('='), a.size());
    for (size_t j = start; j < end && start != std::string::npos; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  std::vector<char*> out;
  for (auto& s : *store) out.push_back(s.data());
  return out;
}

// "int8" or "f32" (the --activations flag).
inline absl::StatusOr<ActivationPrecision> ParseActivations(const std::string& s) {
  if (s == "int8") return ActivationPrecision::kInt8;
  if (s == "f32") return ActivationPrecision::kF32;
  return absl::InvalidArgumentError("--activations must be int8 or f32, got '" + s + "'");
}

}  // namespace riskkv
