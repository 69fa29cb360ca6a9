// The SmolLM2 retention policy that ships in deploy/policies (what deploy/demo.sh, the
// two-namespace run and the compose guide use) loads as a node loads it, for the model
// deploy/setup.sh fetches: fingerprint, bank hash and groups all match, and the files beside it
// (its text form and calibration.json) describe the same policy.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/retention_policy.h"
#include "services/node/retention.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ShippedPolicy, LoadsAsANodeLoadsItAndItsFilesAgree) {
  const fs::path dir = fs::path(RISKKV_SOURCE_DIR) / "deploy/policies/smollm2-135m-instruct";
  auto model = Model::Load(testing::DefaultModelPath().string(), {.threads = 1});
  ASSERT_TRUE(model.ok()) << model.status();
  auto fingerprint = ModelFingerprint(**model);
  ASSERT_TRUE(fingerprint.ok());
  // A policy that needs no bank (it rebuilds nothing and its wire form is not the transform
  // form) ships without one.
  const bool has_bank = fs::exists(dir / "bank.rkvbank");
  auto retention =
      LoadRetention((dir / "policy.pb").string(), has_bank ? (dir / "bank.rkvbank").string() : "",
                    static_cast<int32_t>((*model)->config().n_layers), *fingerprint);
  ASSERT_TRUE(retention.ok()) << retention.status();
  const RetentionPolicy& p = (*retention)->policy;
  EXPECT_EQ(p.policy_id, "smollm2-135m-instruct");
  EXPECT_EQ(has_bank, PolicyNeedsBank(p));
  // It sends fewer bytes than FULL_KV plain, by omission or by its wire form.
  EXPECT_TRUE(!p.rebuilt_groups.empty() || PolicyWireForm(p) != WireForm::kPlain);
  EXPECT_EQ(p.arithmetic, "int8");  // what nodes serve with by default
  EXPECT_EQ(Slurp(dir / "policy.txt"), PolicyToText(p));

  auto json = nlohmann::json::parse(Slurp(dir / "calibration.json"), nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_EQ(json["chosen"]["wire_form"], p.wire_form.empty() ? "plain" : p.wire_form);
  EXPECT_EQ(json["chosen"]["arithmetic"], p.arithmetic);
  EXPECT_EQ(json["predictor_bank_sha256"], p.predictor_bank_sha256);
  EXPECT_DOUBLE_EQ(json["chosen"]["test"]["mean"].get<double>(), p.test_delta_nll.mean);
  EXPECT_TRUE(fs::exists(dir / "report.html"));
}

}  // namespace
}  // namespace riskkv
