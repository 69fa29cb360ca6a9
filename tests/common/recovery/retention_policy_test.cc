// Retention policies: the struct's round trip through its proto and its files, the text form,
// every structural check, and validation on every way in (proto, bytes, file).
#include "common/recovery/retention_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/recovery/policy_codec.h"

namespace riskkv {
namespace {

// SmolLM2-shaped: 30 layers, two groups rebuilt (L1-2 <- L0,L3 and L4-5 <- L3,L6).
RetentionPolicy Valid() {
  RetentionPolicy p;
  p.model_fingerprint = std::string(64, 'a');
  p.policy_id = "smollm2-135m";
  p.version = 3;
  p.epsilon = 0.005;
  p.gate = "upper90";
  for (int l = 0; l < 30; ++l) {
    if (l != 1 && l != 2 && l != 4 && l != 5) p.kept_layers.push_back(l);
  }
  p.rebuilt_groups = {{{1, 2}, {0, 3}}, {{4, 5}, {3, 6}}};
  p.singleton_risks = {{p.rebuilt_groups[0], {.mean = 0.0012, .requests = 64}}};
  p.path = {{.groups = 2,
             .kv_omitted_fraction = 4.0 / 30,
             .delta_nll = {},
             .passed = true,
             .wire_form = "",
             .kv_sent_fraction = 0}};
  p.kv_bytes_per_token = 30 * 2 * 192 * 2;
  p.kv_bytes_saved_per_token = 4 * 2 * 192 * 2;
  p.predictor_bank_sha256 = std::string(64, 'b');
  return p;
}

// Valid() with every field away from its default, quality data included, so a field the
// conversion drops or swaps shows.
RetentionPolicy EveryField() {
  RetentionPolicy p = Valid();
  p.singleton_risks = {
      {{{1, 2}, {0, 3}}, {.mean = 0.0012, .ci_low = -0.0003, .ci_high = 0.0031, .requests = 64}},
      {{{4, 5}, {3, 6}}, {.mean = 0.0025, .ci_low = 0.0007, .ci_high = 0.0049, .requests = 64}},
  };
  p.path = {
      {.groups = 1,
       .kv_omitted_fraction = 2.0 / 30,
       .delta_nll = {.mean = 0.0011, .ci_low = -0.0002, .ci_high = 0.0029, .requests = 32},
       .gate_statistic = 0.0024,
       .passed = true,
       .wire_form = "",
       .kv_sent_fraction = 0},
      {.groups = 2,
       .kv_omitted_fraction = 4.0 / 30,
       .delta_nll = {.mean = 0.0036, .ci_low = 0.0012, .ci_high = 0.0061, .requests = 32},
       .gate_statistic = 0.0057,
       .passed = false,
       .wire_form = "int4",
       .kv_sent_fraction = 0.24},
  };
  p.test_delta_nll = {.mean = 0.0009, .ci_low = -0.0004, .ci_high = 0.0022, .requests = 128};
  p.history_tokens = 480;
  p.eval_tokens = 32;
  p.kv_dtype = "f16";
  p.wire_form = "int8";
  p.arithmetic = "int8";
  return p;
}

std::string TempPath(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

TEST(RetentionPolicy, RoundTripsEveryFieldThroughProtoAndBytes) {
  const RetentionPolicy p = EveryField();
  ASSERT_TRUE(p.Validate(30).ok());
  const v1::RetentionPolicy proto = PolicyToProto(p);
  EXPECT_EQ(proto.format_version(), 1u);
  EXPECT_EQ(proto.rebuilt_groups_size(), 2);
  EXPECT_EQ(proto.path(1).delta_nll().ci_high(), 0.0061);
  auto back = ParsePolicy(proto.SerializeAsString(), 30, std::string(64, 'a'));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  // Field by field too, so a failure says which one.
  EXPECT_EQ(back->kept_layers, p.kept_layers);
  EXPECT_EQ(back->rebuilt_groups, p.rebuilt_groups);
  EXPECT_EQ(back->singleton_risks, p.singleton_risks);
  EXPECT_EQ(back->path, p.path);
  EXPECT_EQ(back->test_delta_nll, p.test_delta_nll);
  EXPECT_EQ(back->kv_dtype, "f16");
  EXPECT_EQ(back->wire_form, "int8");
  EXPECT_EQ(back->arithmetic, "int8");
  EXPECT_EQ(proto.wire_form(), "int8");
  EXPECT_EQ(proto.arithmetic(), "int8");
  EXPECT_EQ(PolicyWireForm(*back), WireForm::kInt8);
  EXPECT_EQ(back->history_tokens, 480);
  EXPECT_EQ(back->eval_tokens, 32);
  // And what the proto reads back as is what it was written from.
  EXPECT_EQ(PolicyToProto(*back).SerializeAsString(), proto.SerializeAsString());
  auto from_proto = PolicyFromProto(proto, 30, "");
  ASSERT_TRUE(from_proto.ok()) << from_proto.status();
  EXPECT_EQ(*from_proto, p);
}

TEST(RetentionPolicy, RoundTripsThroughAFileAndPrints) {
  const RetentionPolicy p = EveryField();
  const std::string path = TempPath("riskkv_policy_test.pb");
  ASSERT_TRUE(WritePolicy(p, path).ok());
  auto back = ReadPolicy(path, 30, std::string(64, 'a'));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  ASSERT_EQ(back->rebuilt_groups.size(), 2u);
  EXPECT_EQ(back->rebuilt_groups[1], (LayerGroup{{4, 5}, {3, 6}}));
  EXPECT_EQ(back->Name(), "smollm2-135m v3");
  const std::string text = PolicyToText(p);
  EXPECT_NE(text.find("gate: \"upper90\""), std::string::npos);
  EXPECT_NE(text.find("policy_id: \"smollm2-135m\""), std::string::npos);
  EXPECT_NE(text.find("gate_statistic: 0.0057"), std::string::npos) << text;
}

TEST(RetentionPolicy, RejectsAPolicyForOtherWeightsOnEveryRead) {
  const std::string other(64, 'c');
  auto expect_other = [&](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(other), std::string::npos) << s;
    EXPECT_NE(s.message().find(std::string(64, 'a')), std::string::npos) << s;
  };
  const v1::RetentionPolicy proto = PolicyToProto(Valid());
  expect_other(PolicyFromProto(proto, 30, other).status());
  expect_other(ParsePolicy(proto.SerializeAsString(), 30, other).status());
  const std::string path = TempPath("riskkv_policy_other.pb");
  ASSERT_TRUE(WritePolicy(Valid(), path).ok());
  const absl::Status s = ReadPolicy(path, 30, other).status();
  expect_other(s);
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
  // Without an expected fingerprint the check is skipped.
  EXPECT_TRUE(ReadPolicy(path, 30, "").ok());
}

TEST(RetentionPolicy, RejectsGarbageAndMissingFiles) {
  const std::string path = TempPath("riskkv_policy_garbage.pb");
  std::ofstream(path, std::ios::binary) << "\xff\xff\xff garbage";
  const absl::Status s = ReadPolicy(path, 30, "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(path + ": not a riskkv.v1.RetentionPolicy"), std::string::npos) << s;
  EXPECT_EQ(ParsePolicy("\xff\xff\xff garbage", 30, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadPolicy(TempPath("riskkv_no_such_policy.pb"), 30, "").status().code(),
            absl::StatusCode::kNotFound);
}

struct Case {
  const char* what;
  void (*mutate)(RetentionPolicy*);
};
const Case kMalformed[] = {
    {"format_version", [](RetentionPolicy* p) { p->format_version = 2; }},
    {"model_fingerprint", [](RetentionPolicy* p) { p->model_fingerprint.clear(); }},
    {"policy_id", [](RetentionPolicy* p) { p->policy_id.clear(); }},
    {"gate", [](RetentionPolicy* p) { p->gate = "median"; }},
    {"epsilon", [](RetentionPolicy* p) { p->epsilon = -0.1; }},
    {"predictor_bank_sha256", [](RetentionPolicy* p) { p->predictor_bank_sha256 = "x"; }},
    {"predictor_bank_sha256",
     [](RetentionPolicy* p) { p->predictor_bank_sha256 = std::string(61, 'a') + "/.."; }},
    {"both kept and rebuilt", [](RetentionPolicy* p) { p->kept_layers.push_back(1); }},
    {"cover", [](RetentionPolicy* p) { p->kept_layers.pop_back(); }},
    {"anchor",
     [](RetentionPolicy* p) {
       p->rebuilt_groups[1].targets = {3, 4};
     }},  // rebuilds 3
    {"KV byte counts", [](RetentionPolicy* p) { p->kv_bytes_saved_per_token = 1 << 30; }},
    {"125 path points and 1 singleton risks for 30 layers: at most 124 and 30",
     [](RetentionPolicy* p) { p->path.resize(125, p->path[0]); }},
    {"singleton risks for 30 layers",
     [](RetentionPolicy* p) { p->singleton_risks.resize(31, p->singleton_risks[0]); }},
    {"kv_dtype", [](RetentionPolicy* p) { p->kv_dtype = "bf16"; }},
    {"history_tokens", [](RetentionPolicy* p) { p->history_tokens = -1; }},
    {"wire form 'int2'", [](RetentionPolicy* p) { p->wire_form = "int2"; }},
    {"arithmetic 'bf16'", [](RetentionPolicy* p) { p->arithmetic = "bf16"; }},
    {"path point 0: wire form 'q3'", [](RetentionPolicy* p) { p->path[0].wire_form = "q3"; }},
    {"path point 0: KV fractions", [](RetentionPolicy* p) { p->path[0].kv_sent_fraction = 1.5; }},
    {"path point 0: KV fractions",
     [](RetentionPolicy* p) { p->path[0].kv_omitted_fraction = std::nan(""); }},
    {"transform_step in (0, 64]",
     [](RetentionPolicy* p) {
       p->wire_form = "transform";
       p->transform_step = 0;
     }},
    {"transform_step in (0, 64]",
     [](RetentionPolicy* p) {
       p->path[0].wire_form = "transform";
       p->transform_step = 1e38;
     }},
    {"transform_bytes_per_token",
     [](RetentionPolicy* p) {
       p->wire_form = "transform";
       p->transform_step = 0.25;
       p->transform_bytes_per_token = std::nan("");
     }},
    {"the transform wire form (the policy's own or a rung's of its ladder) need the predictor bank",
     [](RetentionPolicy* p) {
       p->wire_form = "transform";
       p->transform_step = 0.25;
       p->rebuilt_groups.clear();
       p->kept_layers.clear();
       for (int l = 0; l < 30; ++l) p->kept_layers.push_back(l);
       p->kv_bytes_saved_per_token = 0;
       p->predictor_bank_sha256.clear();
     }},
};

TEST(RetentionPolicy, StructuralChecks) {
  for (const Case& c : kMalformed) {
    RetentionPolicy p = Valid();
    c.mutate(&p);
    const absl::Status s = p.Validate(30);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(s.message().find(c.what), std::string::npos) << c.what << ": " << s.message();
  }
  // A policy that rebuilds nothing needs no bank.
  RetentionPolicy exact = Valid();
  exact.rebuilt_groups.clear();
  exact.predictor_bank_sha256.clear();
  exact.kept_layers.clear();
  for (int l = 0; l < 30; ++l) exact.kept_layers.push_back(l);
  exact.kv_bytes_saved_per_token = 0;
  EXPECT_TRUE(exact.Validate(30).ok());
  // An old policy names no wire form or arithmetic: plain, unknown.
  RetentionPolicy old = Valid();
  old.wire_form.clear();
  old.arithmetic.clear();
  EXPECT_TRUE(old.Validate(30).ok());
  EXPECT_EQ(PolicyWireForm(old), WireForm::kPlain);
  EXPECT_FALSE(PolicyNeedsBank(exact));
  // The transform form needs its bank even with every layer kept; a path point in it (the
  // policy itself plain) needs the step only.
  RetentionPolicy transform = exact;
  transform.wire_form = "transform";
  transform.transform_step = 0.25;
  transform.predictor_bank_sha256 = std::string(64, 'b');
  EXPECT_TRUE(transform.Validate(30).ok());
  EXPECT_TRUE(PolicyNeedsBank(transform));
  RetentionPolicy on_path = Valid();
  on_path.path[0].wire_form = "transform";
  on_path.transform_step = 2;
  EXPECT_TRUE(on_path.Validate(30).ok());
  EXPECT_EQ(PolicyWireForm(on_path), WireForm::kPlain);
}

TEST(RetentionPolicy, MalformedPoliciesAreRefusedWhenRead) {
  for (const Case& c : kMalformed) {
    RetentionPolicy p = Valid();
    c.mutate(&p);
    const std::string bytes = PolicyToProto(p).SerializeAsString();
    // Malformed comes before foreign: the fingerprint check would pass here.
    for (const absl::Status& s : {PolicyFromProto(PolicyToProto(p), 30, "").status(),
                                  ParsePolicy(bytes, 30, std::string(64, 'a')).status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
      EXPECT_NE(s.message().find(c.what), std::string::npos) << c.what << ": " << s;
    }
    const std::string path = TempPath("riskkv_policy_malformed.pb");
    ASSERT_TRUE(WritePolicy(p, path).ok());  // files are checked when read, not when written
    const absl::Status s = ReadPolicy(path, 30, "").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_NE(s.message().find(path + ": retention policy: "), std::string::npos) << s;
  }
  // The wrong layer count for the model reading it.
  EXPECT_EQ(PolicyFromProto(PolicyToProto(Valid()), 32, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RetentionPolicy, ReadersWithoutAModelCheckTheLayersThePolicyImplies) {
  EXPECT_TRUE(PolicyFromProto(PolicyToProto(Valid()), 0, "").ok());
  RetentionPolicy p = Valid();
  p.kept_layers.pop_back();  // a 29-layer model's policy
  EXPECT_TRUE(PolicyFromProto(PolicyToProto(p), 0, "").ok());
  p = Valid();
  std::erase(p.kept_layers, 10);  // neither kept nor rebuilt
  absl::Status s = PolicyFromProto(PolicyToProto(p), 0, "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cover 29 of 30"), std::string::npos) << s;
  p = Valid();
  p.kept_layers.clear();
  p.rebuilt_groups.clear();
  s = PolicyFromProto(PolicyToProto(p), 0, "").status();
  EXPECT_NE(s.message().find("lists no layers"), std::string::npos) << s;
  p = Valid();
  p.kept_layers.push_back(5000);
  s = PolicyFromProto(PolicyToProto(p), 0, "").status();
  EXPECT_NE(s.message().find("above 4095"), std::string::npos) << s;
  // The largest id a proto can carry (found by policy_fuzz: one past it overflowed).
  p = Valid();
  p.kept_layers.push_back(std::numeric_limits<int32_t>::max());
  s = PolicyFromProto(PolicyToProto(p), 0, "").status();
  EXPECT_NE(s.message().find("above 4095"), std::string::npos) << s;
}

}  // namespace
}  // namespace riskkv
