// Command-line spelling shared by the binaries: "--tokens-file" and "--tokens_file" both name
// the absl flag tokens_file, so flags read the same as the documentation in either form.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "common/tokenizer/tokenizer.h"
#include "kernels/backend.h"

namespace riskkv {

// Rewrites "--a-b[=v]" to "--a_b[=v]" when a_b (or, for a boolean, a_b after a "no" prefix) is a
// registered flag. Values, positional arguments and unknown flags are left exactly as typed, so
// `--prompt "- a list - item"` reaches the program unchanged. Call before absl::ParseCommandLine;
// the strings live in *store.
// Whether the arguments NormalizeFlagNames returned (in `store`) set the bool flag `name`
// (--name, --name=..., --noname, one dash or two).
inline bool FlagGiven(const std::vector<std::string>& store, const std::string& name) {
  for (size_t i = 1; i < store.size(); ++i) {
    const std::string& a = store[i];
    if (a == "--") break;
    const size_t start = a.find_first_not_of('-');
    if (start == 0 || start == std::string::npos || start > 2) continue;
    const std::string flag = a.substr(start, a.find('=') - start);
    if (flag == name || flag == "no" + name) return true;
  }
  return false;
}

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

// Model options from the --threads and --activations ("int8" or "f32") flags.
inline absl::StatusOr<ModelOptions> ModelOptionsFromFlags(int threads,
                                                          const std::string& activations) {
  ModelOptions options;
  options.threads = threads;
  if (activations == "int8") {
    options.activations = ActivationPrecision::kInt8;
  } else if (activations == "f32") {
    options.activations = ActivationPrecision::kF32;
  } else {
    return absl::InvalidArgumentError("--activations must be int8 or f32, got '" + activations +
                                      "'");
  }
  return options;
}

// A KV cache or map storage dtype from the flag `flag` ("kv-dtype", ...): "f16" or "f32".
inline absl::StatusOr<DType> FloatDTypeFromFlag(const std::string& flag, const std::string& value) {
  if (value == "f16") return DType::kF16;
  if (value == "f32") return DType::kF32;
  return absl::InvalidArgumentError("--" + flag + " must be f16 or f32, got '" + value + "'");
}

inline absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
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

// Token ids from a JSON list in `tokens_file` when it is set, else the text of `text_file`
// through the model's tokenizer (no BOS).
inline absl::StatusOr<std::vector<int32_t>> LoadTokens(const Tokenizer& tokenizer,
                                                       const std::string& tokens_file,
                                                       const std::string& text_file) {
  if (tokens_file.empty() && text_file.empty()) {
    return absl::InvalidArgumentError("one of --tokens-file or --text-file is required");
  }
  auto content = ReadFileToString(tokens_file.empty() ? text_file : tokens_file);
  if (!content.ok()) return content.status();
  if (!tokens_file.empty()) return TokenIdsFromJson(*content);
  return tokenizer.Encode(*content, /*add_special=*/false, /*parse_special=*/false);
}

}  // namespace riskkv
