// RetentionPolicy <-> riskkv.v1.RetentionPolicy (see policy_codec.h).
#include "common/recovery/policy_codec.h"

#include <algorithm>

#include "common/base/status_macros.h"

namespace riskkv {
namespace {

using DeltaNll = RetentionPolicy::DeltaNll;
using GroupRisk = RetentionPolicy::GroupRisk;
using PathPoint = RetentionPolicy::PathPoint;

// The control plane serves policies for models it has never loaded.
constexpr int32_t kMaxImpliedLayers = 4096;

LayerGroup FromProto(const v1::LayerGroup& g) {
  return {{g.targets().begin(), g.targets().end()}, {g.anchors().begin(), g.anchors().end()}};
}

DeltaNll FromProto(const v1::DeltaNll& d) {
  return {d.mean(), d.ci_low(), d.ci_high(), d.requests()};
}

void ToProto(const LayerGroup& g, v1::LayerGroup* out) {
  out->mutable_targets()->Add(g.targets.begin(), g.targets.end());
  out->mutable_anchors()->Add(g.anchors.begin(), g.anchors.end());
}

void ToProto(const DeltaNll& d, v1::DeltaNll* out) {
  out->set_mean(d.mean);
  out->set_ci_low(d.ci_low);
  out->set_ci_high(d.ci_high);
  out->set_requests(d.requests);
}

// The n for which the policy's layer ids would partition [0, n).
absl::StatusOr<int32_t> ImpliedLayers(const RetentionPolicy& p) {
  int64_t n = 0;  // wide: a layer id of INT32_MAX must not overflow
  auto see = [&n](int32_t l) { n = std::max(n, int64_t{l} + 1); };
  for (int32_t l : p.kept_layers) see(l);
  for (const LayerGroup& g : p.rebuilt_groups) {
    for (int32_t l : g.targets) see(l);
    for (int32_t l : g.anchors) see(l);
  }
  if (n == 0) return absl::InvalidArgumentError("retention policy: it lists no layers");
  if (n > kMaxImpliedLayers) {
    return absl::InvalidArgumentError("retention policy: layer ids above 4095");
  }
  return static_cast<int32_t>(n);
}

}  // namespace

absl::StatusOr<RetentionPolicy> PolicyFromProto(const v1::RetentionPolicy& proto, int32_t n_layers,
                                                const std::string& expected_fingerprint) {
  RetentionPolicy p;
  p.format_version = proto.format_version();
  p.model_fingerprint = proto.model_fingerprint();
  p.policy_id = proto.policy_id();
  p.version = proto.version();
  p.epsilon = proto.epsilon();
  p.gate = proto.gate();
  p.kept_layers.assign(proto.kept_layers().begin(), proto.kept_layers().end());
  for (const v1::LayerGroup& g : proto.rebuilt_groups()) p.rebuilt_groups.push_back(FromProto(g));
  for (const v1::GroupRisk& r : proto.singleton_risks()) {
    p.singleton_risks.push_back({FromProto(r.group()), FromProto(r.delta_nll())});
  }
  for (const v1::PathPoint& pt : proto.path()) {
    p.path.push_back({pt.groups(), pt.kv_omitted_fraction(), FromProto(pt.delta_nll()),
                      pt.gate_statistic(), pt.passed(), pt.wire_form(), pt.kv_sent_fraction(),
                      pt.in_bank()});
  }
  p.kv_bytes_per_token = proto.kv_bytes_per_token();
  p.kv_bytes_saved_per_token = proto.kv_bytes_saved_per_token();
  p.predictor_bank_sha256 = proto.predictor_bank_sha256();
  p.test_delta_nll = FromProto(proto.test_delta_nll());
  p.history_tokens = proto.history_tokens();
  p.eval_tokens = proto.eval_tokens();
  p.kv_dtype = proto.kv_dtype();
  p.wire_form = proto.wire_form();
  p.arithmetic = proto.arithmetic();
  p.transform_step = proto.transform_step();
  p.transform_bytes_per_token = proto.transform_bytes_per_token();

  if (n_layers == 0) {
    ASSIGN_OR_RETURN(n_layers, ImpliedLayers(p));
  }
  RETURN_IF_ERROR(p.Validate(n_layers));
  if (!expected_fingerprint.empty() && p.model_fingerprint != expected_fingerprint) {
    return absl::FailedPreconditionError("policy is for model " + p.model_fingerprint + ", not " +
                                         expected_fingerprint);
  }
  return p;
}

v1::RetentionPolicy PolicyToProto(const RetentionPolicy& p) {
  v1::RetentionPolicy out;
  out.set_format_version(p.format_version);
  out.set_model_fingerprint(p.model_fingerprint);
  out.set_policy_id(p.policy_id);
  out.set_version(p.version);
  out.set_epsilon(p.epsilon);
  out.set_gate(p.gate);
  out.mutable_kept_layers()->Add(p.kept_layers.begin(), p.kept_layers.end());
  for (const LayerGroup& g : p.rebuilt_groups) ToProto(g, out.add_rebuilt_groups());
  for (const GroupRisk& r : p.singleton_risks) {
    v1::GroupRisk* risk = out.add_singleton_risks();
    ToProto(r.group, risk->mutable_group());
    ToProto(r.delta_nll, risk->mutable_delta_nll());
  }
  for (const PathPoint& pt : p.path) {
    v1::PathPoint* point = out.add_path();
    point->set_groups(pt.groups);
    point->set_kv_omitted_fraction(pt.kv_omitted_fraction);
    ToProto(pt.delta_nll, point->mutable_delta_nll());
    point->set_gate_statistic(pt.gate_statistic);
    point->set_passed(pt.passed);
    point->set_wire_form(pt.wire_form);
    point->set_kv_sent_fraction(pt.kv_sent_fraction);
    point->set_in_bank(pt.in_bank);
  }
  out.set_kv_bytes_per_token(p.kv_bytes_per_token);
  out.set_kv_bytes_saved_per_token(p.kv_bytes_saved_per_token);
  out.set_predictor_bank_sha256(p.predictor_bank_sha256);
  ToProto(p.test_delta_nll, out.mutable_test_delta_nll());
  out.set_history_tokens(p.history_tokens);
  out.set_eval_tokens(p.eval_tokens);
  out.set_kv_dtype(p.kv_dtype);
  out.set_wire_form(p.wire_form);
  out.set_arithmetic(p.arithmetic);
  out.set_transform_step(p.transform_step);
  out.set_transform_bytes_per_token(p.transform_bytes_per_token);
  return out;
}

absl::StatusOr<RetentionPolicy> ParsePolicy(std::string_view bytes, int32_t n_layers,
                                            const std::string& expected_fingerprint) {
  v1::RetentionPolicy proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("not a riskkv.v1.RetentionPolicy");
  }
  return PolicyFromProto(proto, n_layers, expected_fingerprint);
}

}  // namespace riskkv
