// Retention policies and their files.
#include "common/recovery/retention_policy.h"

#include <google/protobuf/text_format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/atomic_file.h"
#include "common/base/status_macros.h"
#include "common/recovery/policy_codec.h"

namespace riskkv {

std::string RetentionPolicy::Name() const { return absl::StrCat(policy_id, " v", version); }

absl::Status RetentionPolicy::Validate(int32_t n_layers) const {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError("retention policy: " + what);
  };
  if (format_version != kRetentionPolicyFormatVersion) {
    return bad(
        absl::StrCat("format_version ", format_version, " is not ", kRetentionPolicyFormatVersion));
  }
  if (model_fingerprint.empty()) return bad("model_fingerprint is empty");
  if (policy_id.empty()) return bad("policy_id is empty");
  if (gate != "mean" && gate != "upper90" && gate != "stable-split") {
    return bad("gate '" + gate + "' is not mean, upper90 or stable-split");
  }
  if (!(epsilon >= 0.0)) return bad(absl::StrCat("epsilon ", epsilon, " is negative"));
  const std::string& sha = predictor_bank_sha256;
  if (sha.empty() && PolicyNeedsBank(*this)) {
    return bad(
        "predictor_bank_sha256 is empty, and rebuilt layers and the transform wire form (the "
        "policy's own or a rung's of its ladder) need the predictor bank");
  }
  if (!sha.empty() &&
      (sha.size() != 64 || sha.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return bad("predictor_bank_sha256 is not a SHA-256 in hex");
  }
  if (auto s = ValidateGroups(rebuilt_groups, n_layers, {}); !s.ok()) {
    return bad(std::string(s.message()));
  }
  std::set<int32_t> layers;
  for (int32_t l : kept_layers) {
    if (l < 0 || l >= n_layers || !layers.insert(l).second) {
      return bad(absl::StrCat("kept layer ", l, " is out of range or listed twice"));
    }
  }
  for (const LayerGroup& g : rebuilt_groups) {
    for (int32_t l : g.targets) {
      if (!layers.insert(l).second) {
        return bad(absl::StrCat("layer ", l, " is both kept and rebuilt"));
      }
    }
  }
  if (static_cast<int32_t>(layers.size()) != n_layers) {
    return bad(
        absl::StrCat("kept and rebuilt layers cover ", layers.size(), " of ", n_layers, " layers"));
  }
  if (!kv_dtype.empty() && kv_dtype != "f16" && kv_dtype != "f32") {
    return bad("kv_dtype '" + kv_dtype + "' is not f16 or f32");
  }
  bool transform = false;
  if (!wire_form.empty()) {
    auto f = ParseWireForm(wire_form);
    if (!f.ok()) return bad(std::string(f.status().message()));
    transform = *f == WireForm::kTransform;
  }
  // One point per form and number of groups at most, one risk per candidate group: a policy's
  // size stays proportional to its model's.
  if (path.size() > static_cast<size_t>(kWireFormCount) * (static_cast<size_t>(n_layers) + 1) ||
      singleton_risks.size() > static_cast<size_t>(n_layers)) {
    return bad(absl::StrCat(path.size(), " path points and ", singleton_risks.size(),
                            " singleton risks for ", n_layers, " layers: at most ",
                            kWireFormCount * (n_layers + 1), " and ", n_layers));
  }
  for (size_t i = 0; i < path.size(); ++i) {
    const PathPoint& pt = path[i];
    if (!pt.wire_form.empty()) {
      auto f = ParseWireForm(pt.wire_form);
      if (!f.ok()) return bad(absl::StrCat("path point ", i, ": ", f.status().message()));
      transform = transform || *f == WireForm::kTransform;
    }
    const auto fraction = [](double f) { return f >= 0.0 && f <= 1.0; };  // false for NaN
    if (!fraction(pt.kv_omitted_fraction) || !fraction(pt.kv_sent_fraction)) {
      return bad(absl::StrCat("path point ", i, ": KV fractions ", pt.kv_omitted_fraction, " and ",
                              pt.kv_sent_fraction, " must be within [0, 1]"));
    }
    if (pt.groups < 0 || (pt.in_bank && pt.groups > static_cast<int32_t>(singleton_risks.size()))) {
      return bad(absl::StrCat("path point ", i, " rebuilds ", pt.groups, " groups of a ranking of ",
                              singleton_risks.size()));
    }
    if (pt.in_bank && pt.groups > 0) {
      // A rung rebuilds the first `groups` ranked groups: they must make a valid retention.
      std::vector<LayerGroup> prefix;
      for (int32_t g = 0; g < pt.groups; ++g) prefix.push_back(singleton_risks[g].group);
      if (auto s = ValidateGroups(prefix, n_layers, {}); !s.ok()) {
        return bad(absl::StrCat("path point ", i, ": ", s.message()));
      }
    }
  }
  if (transform) {
    // Written as negations so that NaN fails them.
    if (!(transform_step > 0.0 && transform_step <= kMaxTransformStep)) {
      return bad(absl::StrCat("the transform wire form needs a transform_step in (0, ",
                              kMaxTransformStep, "], not ", transform_step));
    }
    if (!(transform_bytes_per_token >= 0.0 && transform_bytes_per_token <= 1e9)) {
      return bad(absl::StrCat("transform_bytes_per_token ", transform_bytes_per_token,
                              " is not within [0, 1e9]"));
    }
  }
  if (!arithmetic.empty() && arithmetic != "int8" && arithmetic != "f32") {
    return bad("arithmetic '" + arithmetic + "' is not int8 or f32");
  }
  if (history_tokens < 0 || eval_tokens < 0) {
    return bad(absl::StrCat("history_tokens ", history_tokens, " and eval_tokens ", eval_tokens,
                            " must be >= 0"));
  }
  if (kv_bytes_per_token < 0 || kv_bytes_saved_per_token < 0 ||
      kv_bytes_saved_per_token > kv_bytes_per_token) {
    return bad("KV byte counts are inconsistent");
  }
  return absl::OkStatus();
}

WireForm PolicyWireForm(const RetentionPolicy& policy) {
  if (policy.wire_form.empty()) return WireForm::kPlain;
  const absl::StatusOr<WireForm> f = ParseWireForm(policy.wire_form);
  return f.ok() ? *f : WireForm::kPlain;
}

bool PolicyNeedsBank(const RetentionPolicy& policy) {
  if (!policy.rebuilt_groups.empty() || PolicyWireForm(policy) == WireForm::kTransform) return true;
  for (const RetentionPolicy::PathPoint& pt : policy.path) {
    if (pt.in_bank && (pt.groups > 0 || ParseWireForm(pt.wire_form).value_or(WireForm::kPlain) ==
                                            WireForm::kTransform)) {
      return true;
    }
  }
  return false;
}

absl::Status WritePolicy(const RetentionPolicy& policy, const std::string& path) {
  std::string bytes;
  if (!PolicyToProto(policy).SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize the retention policy for " + path);
  }
  return WriteFileAtomically(path, bytes);
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

absl::StatusOr<RetentionPolicy> ReadPolicy(const std::string& path, int32_t n_layers,
                                           const std::string& expected_fingerprint) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open retention policy " + path);
  std::stringstream bytes;
  bytes << in.rdbuf();
  auto policy = ParsePolicy(bytes.str(), n_layers, expected_fingerprint);
  if (!policy.ok()) {
    return absl::Status(policy.status().code(),
                        path + ": " + std::string(policy.status().message()));
  }
  return policy;
}

std::string PolicyToText(const RetentionPolicy& policy) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(PolicyToProto(policy), &text);
  return text;
}

}  // namespace riskkv
