// A model's retention policy: which layers a migration sends exact and which the target rebuilds,
// with the measurements that justify the choice, and its files. Stored as riskkv.v1.RetentionPolicy
// (binary protobuf, converted in policy_codec.h only), so the engine sees this plain struct and
// never a proto type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcodec/wire_form.h"
#include "common/recovery/layer_group.h"

namespace riskkv {

inline constexpr uint32_t kRetentionPolicyFormatVersion = 1;
// The largest transform step ratio a policy may name (riskkv-calibrate's --transform-step too).
inline constexpr double kMaxTransformStep = 64.0;

struct RetentionPolicy {
  // Mean per-request NLL increase with a paired 95% bootstrap interval.
  struct DeltaNll {
    double mean = 0.0;
    double ci_low = 0.0;
    double ci_high = 0.0;
    int32_t requests = 0;  // requests the figures are over

    bool operator==(const DeltaNll&) const = default;
  };

  struct GroupRisk {
    LayerGroup group;
    DeltaNll delta_nll;  // this group alone rebuilt, every other layer exact

    bool operator==(const GroupRisk&) const = default;
  };

  // One configuration on the ordered path, measured on the selection (validation) requests: the
  // first `groups` groups of the risk ranking rebuilt, the kept layers sent in `wire_form`.
  struct PathPoint {
    int32_t groups = 0;
    double kv_omitted_fraction = 0.0;  // of the layers' KV, not sent
    DeltaNll delta_nll;
    double gate_statistic = 0.0;    // what the gate compared with epsilon
    bool passed = false;            // within the gate's budget
    std::string wire_form;          // "plain", "int8", "int4" or "transform"; empty: plain
    double kv_sent_fraction = 0.0;  // bytes sent, as a share of every layer's KV in the KV dtype
    // A rung of the policy's ladder: the bank holds the predictors (and transforms) this point
    // was measured with, so a node can migrate at it (policy_ladder.h).
    bool in_bank = false;

    bool operator==(const PathPoint&) const = default;
  };

  uint32_t format_version = kRetentionPolicyFormatVersion;  // of the stored form
  std::string model_fingerprint;     // ModelFingerprint(): the policy applies to these weights only
  std::string policy_id;             // see ValidatePolicyId
  uint64_t version = 0;              // increases with every update of policy_id
  double epsilon = 0.0;              // budget on the mean NLL increase
  std::string gate;                  // "mean", "upper90" or "stable-split"
  std::vector<int32_t> kept_layers;  // sent exact, ascending
  std::vector<LayerGroup> rebuilt_groups;  // rebuilt on the target
  std::vector<GroupRisk> singleton_risks;  // every candidate, in ranking order
  std::vector<PathPoint> path;             // joint configurations measured along the ranking
  int64_t kv_bytes_per_token = 0;          // all layers, K and V, at the KV dtype
  int64_t kv_bytes_saved_per_token = 0;    // of which not sent
  std::string predictor_bank_sha256;       // content hash of the bank the rebuild needs
  DeltaNll test_delta_nll;                 // the chosen configuration on held-out test requests
  int32_t history_tokens = 0;              // H of the calibration requests
  int32_t eval_tokens = 0;                 // T of the calibration requests
  std::string kv_dtype;  // "f32" or "f16": the dtype the byte counts assume; empty: unknown
  // The wire form RECONSTRUCT sends the kept layers in, as calibrated: "plain", "int8", "int4" or
  // "transform" (common/kvcodec/wire_form.h); empty reads as plain (see PolicyWireForm).
  std::string wire_form;
  // The activation precision the ΔNLL figures were measured in: "int8" or "f32"; empty: unknown.
  std::string arithmetic;
  // The transform form's step ratio (transform_codec.h TransformStep), for "transform" here and on
  // the path (0 when no point uses it); the transforms are in the predictor bank.
  double transform_step = 0.0;
  // Mean bytes of one layer's keys and values per history row in the transform form, measured on
  // the calibration's training text (0 when no point uses it): transfer estimates use it.
  double transform_bytes_per_token = 0.0;

  // "ID vN", for messages.
  std::string Name() const;

  // Structural checks against a model of `n_layers` layers (InvalidArgument naming the field):
  // format version, non-empty fingerprint and id, a known gate, epsilon >= 0, groups valid
  // (consecutive targets, anchors not rebuilt), kept and rebuilt layers partitioning
  // [0, n_layers), a hex SHA-256 bank hash when PolicyNeedsBank or a hash is given, a known KV
  // dtype, a known wire form and arithmetic, token counts >= 0 and saved bytes <= total bytes,
  // at most kWireFormCount * (n_layers + 1) path points and n_layers singleton risks, path points
  // with fractions in [0, 1] and groups >= 0 (a rung's at most the ranking's, its first groups a
  // valid set), and, where the policy or its path names the transform form, a
  // transform_step in (0, kMaxTransformStep] and a transform_bytes_per_token in [0, 1e9].
  absl::Status Validate(int32_t n_layers) const;

  bool operator==(const RetentionPolicy&) const = default;
};

// The form a RECONSTRUCT under `policy` sends (its wire_form; plain when empty). The policy must
// have passed Validate.
WireForm PolicyWireForm(const RetentionPolicy& policy);

// Whether a node needs the policy's predictor bank to migrate under it: the policy, or a rung of
// its ladder (a path point in_bank), rebuilds layers or sends the kept layers in the transform
// form (whose transforms the bank holds).
bool PolicyNeedsBank(const RetentionPolicy& policy);

// A policy id names files and directories: 1-128 characters of [A-Za-z0-9._-], not starting
// with '.', '_' or '-'.
absl::Status ValidatePolicyId(const std::string& id);

// Binary, as it is: checks happen when a policy is read.
absl::Status WritePolicy(const RetentionPolicy& policy, const std::string& path);

// Reads and checks a policy file as ParsePolicy (policy_codec.h) does, naming the file in errors;
// NotFound when it cannot be opened. Validation happens here, once: what comes back is a policy
// for the model described by n_layers and expected_fingerprint (see PolicyFromProto).
absl::StatusOr<RetentionPolicy> ReadPolicy(const std::string& path, int32_t n_layers,
                                           const std::string& expected_fingerprint);

// Protobuf text format, for people.
std::string PolicyToText(const RetentionPolicy& policy);

}  // namespace riskkv
