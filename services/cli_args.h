// Command-line spelling shared by the binaries: "--tokens-file" and "--tokens_file" both name
// the absl flag tokens_file, so flags read the same as the documentation in either form.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace riskkv {

// Rewrites "--a-b[=v]" to "--a_b[=v]" when a_b (or, for a boolean, a_b after a "no" prefix) is a
// registered flag. Values, positional arguments and unknown flags are left exactly as typed, so
// `--prompt "- a list - item"` reaches the program unchanged. Call before absl::ParseCommandLine;
// the strings live in *store.
inline std::vector<char*> NormalizeFlagNames(int argc, char** argv,
                                             std::vector<std::string>* store) {
  store->assign(argv, argv + argc);
  for (size_t i = 1; i < store->size(); ++i) {
    std::string& a = (*store)[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-') continue;
    const size_t start = a.find_first_not_of('-');
    if (start == std::string::npos || start > 2) continue;
    const size_t end = std::min(a.find('='), a.size());
    std::string name = a.substr(start, end - start);
    for (char& c : name) c = c == '-' ? '_' : c;
    const bool known =
        absl::FindCommandLineFlag(name) != nullptr ||
        (name.rfind("no", 0) == 0 && absl::FindCommandLineFlag(name.substr(2)) != nullptr);
    if (known) a.replace(start, end - start, name);
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

// Token ids from a JSON list: every element an integer in [0, 2^31).
inline absl::StatusOr<std::vector<int32_t>> TokenIdsFromJson(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array())
    return absl::InvalidArgumentError("token file must hold a JSON list of integers");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& v = j[i];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX) ||
        (!v.is_number_unsigned() && (v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX))) {
      return absl::InvalidArgumentError("token file: element " + std::to_string(i) +
                                        " is not a token id (an integer in [0, 2^31))");
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

}  // namespace riskkv
