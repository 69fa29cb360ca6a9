// Retention policy files.
#include "common/recovery/retention_policy.h"

#include <google/protobuf/text_format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/atomic_file.h"
#include "common/base/status_macros.h"

namespace riskkv {

std::vector<LayerGroup> RebuiltGroups(const v1::RetentionPolicy& policy) {
  std::vector<LayerGroup> out;
  for (const auto& g : policy.rebuilt_groups()) {
    out.push_back(
        {{g.targets().begin(), g.targets().end()}, {g.anchors().begin(), g.anchors().end()}});
  }
  return out;
}

absl::Status ValidatePolicy(const v1::RetentionPolicy& p, int32_t n_layers) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("retention policy: " + what);
  };
  if (p.format_version() != 1)
    return bad(absl::StrCat("format_version ", p.format_version(), " is not 1"));
  if (p.model_fingerprint().empty()) return bad("model_fingerprint is empty");
  if (p.policy_id().empty()) return bad("policy_id is empty");
  if (p.gate() != "mean" && p.gate() != "upper90" && p.gate() != "stable-split") {
    return bad("gate '" + p.gate() + "' is not mean, upper90 or stable-split");
  }
  if (!(p.epsilon() >= 0.0)) return bad(absl::StrCat("epsilon ", p.epsilon(), " is negative"));
  const std::vector<LayerGroup> groups = RebuiltGroups(p);
  const std::string& sha = p.predictor_bank_sha256();
  if ((!groups.empty() || !sha.empty()) &&
      (sha.size() != 64 || sha.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return bad("predictor_bank_sha256 is not a SHA-256 in hex");
  }
  if (auto s = ValidateGroups(groups, n_layers, {}); !s.ok()) return bad(std::string(s.message()));
  std::set<int32_t> layers;
  for (int32_t l : p.kept_layers()) {
    if (l < 0 || l >= n_layers || !layers.insert(l).second) {
      return bad(absl::StrCat("kept layer ", l, " is out of range or listed twice"));
    }
  }
  for (const LayerGroup& g : groups) {
    for (int32_t l : g.targets) {
      if (!layers.insert(l).second)
        return bad(absl::StrCat("layer ", l, " is both kept and rebuilt"));
    }
  }
  if (static_cast<int32_t>(layers.size()) != n_layers) {
    return bad(
        absl::StrCat("kept and rebuilt layers cover ", layers.size(), " of ", n_layers, " layers"));
  }
  if (!p.kv_dtype().empty() && p.kv_dtype() != "f16" && p.kv_dtype() != "f32") {
    return bad("kv_dtype '" + p.kv_dtype() + "' is not f16 or f32");
  }
  if (p.history_tokens() < 0 || p.eval_tokens() < 0) {
    return bad(absl::StrCat("history_tokens ", p.history_tokens(), " and eval_tokens ",
                            p.eval_tokens(), " must be >= 0"));
  }
  if (p.kv_bytes_per_token() < 0 || p.kv_bytes_saved_per_token() < 0 ||
      p.kv_bytes_saved_per_token() > p.kv_bytes_per_token()) {
    return bad("KV byte counts are inconsistent");
  }
  return absl::OkStatus();
}

absl::Status WritePolicy(const v1::RetentionPolicy& policy, const std::string& path) {
  std::string bytes;
  if (!policy.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize the retention policy for " + path);
  }
  return WriteFileAtomically(path, bytes);
}

absl::Status ValidatePolicyForModel(const v1::RetentionPolicy& policy, int32_t n_layers,
                                    const std::string& expected_fingerprint) {
  RETURN_IF_ERROR(ValidatePolicy(policy, n_layers));
  if (!expected_fingerprint.empty() && policy.model_fingerprint() != expected_fingerprint) {
    return absl::FailedPreconditionError("policy is for model " + policy.model_fingerprint() +
                                         ", not " + expected_fingerprint);
  }
  return absl::OkStatus();
}

absl::Status ValidatePolicyId(const std::string& id) {
  static const std::regex re("[A-Za-z0-9][A-Za-z0-9._-]{0,127}");
  if (!std::regex_match(id, re)) {
    return absl::InvalidArgumentError("policy_id '" + id +
                                      "' must be 1-128 characters of [A-Za-z0-9._-], starting "
                                      "with a letter or digit");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RetentionPolicy> ReadPolicy(const std::string& path, int32_t n_layers,
                                               const std::string& expected_fingerprint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open retention policy " + path);
  std::stringstream bytes;
  bytes << in.rdbuf();
  v1::RetentionPolicy policy;
  if (!policy.ParseFromString(bytes.str())) {
    return absl::InvalidArgumentError(path + ": not a riskkv.v1.RetentionPolicy");
  }
  if (auto s = ValidatePolicyForModel(policy, n_layers, expected_fingerprint); !s.ok()) {
    return absl::Status(s.code(), path + ": " + std::string(s.message()));
  }
  return policy;
}

std::string PolicyToText(const v1::RetentionPolicy& policy) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(policy, &text);
  return text;
}

}  // namespace riskkv
