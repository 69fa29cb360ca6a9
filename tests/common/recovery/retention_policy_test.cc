// Retention policy files: round trip, text form, and every structural check.
#include "common/recovery/retention_policy.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace riskkv {
namespace {

// SmolLM2-shaped: 30 layers, two groups rebuilt (L1-2 <- L0,L3 and L4-5 <- L3,L6).
v1::RetentionPolicy Valid() {
  v1::RetentionPolicy p;
  p.set_format_version(1);
  p.set_model_fingerprint(std::string(64, 'a'));
  p.set_policy_id("smollm2-135m");
  p.set_version(3);
  p.set_epsilon(0.005);
  p.set_gate("upper90");
  for (int l = 0; l < 30; ++l) {
    if (l != 1 && l != 2 && l != 4 && l != 5) p.add_kept_layers(l);
  }
  for (auto [t0, a0] : {std::pair{1, 0}, std::pair{4, 3}}) {
    auto* g = p.add_rebuilt_groups();
    g->add_targets(t0);
    g->add_targets(t0 + 1);
    g->add_anchors(a0);
    g->add_anchors(a0 + 3);
  }
  auto* risk = p.add_singleton_risks();
  *risk->mutable_group() = p.rebuilt_groups(0);
  risk->mutable_delta_nll()->set_mean(0.0012);
  risk->mutable_delta_nll()->set_requests(64);
  auto* point = p.add_path();
  point->set_groups(2);
  point->set_kv_omitted_fraction(4.0 / 30);
  point->set_passed(true);
  p.set_kv_bytes_per_token(30 * 2 * 192 * 2);
  p.set_kv_bytes_saved_per_token(4 * 2 * 192 * 2);
  p.set_predictor_bank_sha256(std::string(64, 'b'));
  return p;
}

std::string TempPath(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

TEST(RetentionPolicy, RoundTripsAndPrints) {
  const v1::RetentionPolicy p = Valid();
  ASSERT_TRUE(ValidatePolicy(p, 30).ok());
  const std::string path = TempPath("riskkv_policy_test.pb");
  ASSERT_TRUE(WritePolicy(p, path).ok());
  auto back = ReadPolicy(path, 30, std::string(64, 'a'));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), p.SerializeAsString());
  const std::vector<LayerGroup> groups = RebuiltGroups(*back);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1], (LayerGroup{{4, 5}, {3, 6}}));
  const std::string text = PolicyToText(p);
  EXPECT_NE(text.find("gate: \"upper90\""), std::string::npos);
  EXPECT_NE(text.find("policy_id: \"smollm2-135m\""), std::string::npos);
}

TEST(RetentionPolicy, RejectsAPolicyForOtherWeights) {
  const std::string path = TempPath("riskkv_policy_other.pb");
  ASSERT_TRUE(WritePolicy(Valid(), path).ok());
  auto r = ReadPolicy(path, 30, std::string(64, 'c'));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find(std::string(64, 'c')), std::string::npos);
}

TEST(RetentionPolicy, RejectsGarbageAndMissingFiles) {
  const std::string path = TempPath("riskkv_policy_garbage.pb");
  std::ofstream(path, std::ios::binary) << "\xff\xff\xff garbage";
  EXPECT_EQ(ReadPolicy(path, 30, "").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadPolicy(TempPath("riskkv_no_such_policy.pb"), 30, "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(RetentionPolicy, StructuralChecks) {
  struct Case {
    const char* what;
    void (*mutate)(v1::RetentionPolicy*);
  };
  const Case cases[] = {
      {"format_version", [](v1::RetentionPolicy* p) { p->set_format_version(2); }},
      {"model_fingerprint", [](v1::RetentionPolicy* p) { p->clear_model_fingerprint(); }},
      {"policy_id", [](v1::RetentionPolicy* p) { p->clear_policy_id(); }},
      {"gate", [](v1::RetentionPolicy* p) { p->set_gate("median"); }},
      {"epsilon", [](v1::RetentionPolicy* p) { p->set_epsilon(-0.1); }},
      {"predictor_bank_sha256", [](v1::RetentionPolicy* p) { p->set_predictor_bank_sha256("x"); }},
      {"predictor_bank_sha256",
       [](v1::RetentionPolicy* p) { p->set_predictor_bank_sha256(std::string(61, 'a') + "/.."); }},
      {"both kept and rebuilt", [](v1::RetentionPolicy* p) { p->add_kept_layers(1); }},
      {"cover", [](v1::RetentionPolicy* p) { p->mutable_kept_layers()->RemoveLast(); }},
      {"anchor",
       [](v1::RetentionPolicy* p) {  // anchor 3 rebuilt by a group
         p->mutable_rebuilt_groups(1)->set_targets(0, 3);
         p->mutable_rebuilt_groups(1)->set_targets(1, 4);
       }},
      {"KV byte counts", [](v1::RetentionPolicy* p) { p->set_kv_bytes_saved_per_token(1 << 30); }},
      {"kv_dtype", [](v1::RetentionPolicy* p) { p->set_kv_dtype("bf16"); }},
      {"history_tokens", [](v1::RetentionPolicy* p) { p->set_history_tokens(-1); }},
  };
  for (const Case& c : cases) {
    v1::RetentionPolicy p = Valid();
    c.mutate(&p);
    const absl::Status s = ValidatePolicy(p, 30);
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.message().find(c.what), std::string::npos) << c.what << ": " << s.message();
  }
  // A policy that rebuilds nothing needs no bank.
  v1::RetentionPolicy exact = Valid();
  exact.clear_rebuilt_groups();
  exact.clear_predictor_bank_sha256();
  for (int l : {1, 2, 4, 5}) exact.add_kept_layers(l);
  exact.set_kv_bytes_saved_per_token(0);
  EXPECT_TRUE(ValidatePolicy(exact, 30).ok());
}

}  // namespace
}  // namespace riskkv
