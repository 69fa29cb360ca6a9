// AUTO's planner: estimates from assumed, configured, measured and reported speeds.
#include "services/node/mode_planner.h"

#include <gtest/gtest.h>

namespace riskkv {
namespace {

// 1000 history tokens of 256-byte rows over 30 layers: 15.36 MB for FULL_KV, 21 layers for
// RECONSTRUCT.
PlanInput Input(int64_t kept = 21) {
  return {.history_tokens = 1000,
          .full_kv_bytes = 2 * 1000 * 256 * 30,
          .reconstruct_bytes = kept < 0 ? -1 : 2 * 1000 * 256 * kept,
          .target = "b:7070"};
}

TEST(ModePlanner, RanksByEstimateFromAssumedSpeeds) {
  // At the assumed 1 Gbit/s: full_kv 0.12288 s, token_replay 3 s, reconstruct
  // 0.086016 + 0.15 = 0.236 s.
  ModePlanner planner({});
  ModePlan plan = planner.Rank(Input());
  EXPECT_EQ(plan.modes,
            (std::vector<MigrationMode>{MigrationMode::kFullKv, MigrationMode::kReconstruct,
                                        MigrationMode::kTokenReplay}));
  EXPECT_NE(plan.reason.find("full_kv 0.12288 s"), std::string::npos) << plan.reason;
  EXPECT_NE(plan.reason.find("(assumed)"), std::string::npos) << plan.reason;
  // No policy: no RECONSTRUCT.
  plan = planner.Rank(Input(-1));
  EXPECT_EQ(plan.modes,
            (std::vector<MigrationMode>{MigrationMode::kFullKv, MigrationMode::kTokenReplay}));
  EXPECT_NE(plan.reason.find("n/a (no policy)"), std::string::npos);
}

TEST(ModePlanner, ASlowLinkFavoursReconstructAndMeasurementsMoveIt) {
  // 10 Mbit/s: full_kv 12.288 s, reconstruct 8.6016 + 0.15 s, replay 3 s.
  ModePlanner planner({.link_bytes_per_second = 10e6 / 8});
  EXPECT_EQ(planner.Rank(Input()).modes.front(), MigrationMode::kTokenReplay);
  // This node measured a slow prefill (1 s for 100 tokens = 10 ms/token: replay 10 s).
  planner.MeasurePrefill(1.0, 100);
  EXPECT_EQ(planner.measured_prefill_seconds_per_token(), 0.01);
  EXPECT_EQ(planner.Rank(Input()).modes.front(), MigrationMode::kReconstruct);
  // The target reports a fast prefill of its own: replay wins again for that target only.
  planner.MeasurePeer("b:7070", 0, 0, 1e-4, 0);
  EXPECT_EQ(planner.Rank(Input()).modes.front(), MigrationMode::kTokenReplay);
  PlanInput other = Input();
  other.target = "c:7070";
  EXPECT_EQ(planner.Rank(other).modes.front(), MigrationMode::kReconstruct);
}

TEST(ModePlanner, BlendsMeasurementsAndIgnoresShortOnes) {
  ModePlanner planner({});
  EXPECT_EQ(planner.measured_rebuild_seconds_per_token(), 0);
  planner.MeasureRebuild(0.5, 4);  // under 8 tokens: ignored
  EXPECT_EQ(planner.measured_rebuild_seconds_per_token(), 0);
  planner.MeasureRebuild(1.0, 1000);
  planner.MeasureRebuild(2.0, 1000);
  EXPECT_DOUBLE_EQ(planner.measured_rebuild_seconds_per_token(), 0.7 * 1e-3 + 0.3 * 2e-3);
  // A transfer rate seen toward the target replaces the assumed one.
  planner.MeasurePeer("b:7070", 1e6, 1.0, 0, 0);
  EXPECT_NE(planner.Rank(Input()).reason.find("at 8 Mbit/s (measured to the target)"),
            std::string::npos);
}

TEST(ModePlanner, PinnedSpeedsStayPinned) {
  ModePlanner planner({.prefill_seconds_per_token = 1e-3, .measure_speeds = false});
  planner.MeasurePrefill(10.0, 100);
  planner.MeasurePeer("b:7070", 1e6, 1.0, 5, 5);
  EXPECT_EQ(planner.measured_prefill_seconds_per_token(), 0);
  EXPECT_NE(planner.Rank(Input()).reason.find("token_replay 1 s"), std::string::npos);
}

TEST(ModePlanner, EstimatesTheBytesOfTheFormEachModeSends) {
  // At 100 Mbit/s plain FULL_KV (1.2288 s) loses to RECONSTRUCT (0.86016 + 0.15 s); int8 FULL_KV
  // (228852 of 368640 bytes per layer at SmolLM2's shape: 0.762 s) wins.
  ModePlanner planner({.link_bytes_per_second = 12.5e6});
  EXPECT_EQ(planner.Rank(Input()).modes.front(), MigrationMode::kReconstruct);
  PlanInput int8 = Input();
  int8.full_kv_bytes =
      static_cast<int64_t>(static_cast<double>(int8.full_kv_bytes) * 228852 / 368640);
  const ModePlan plan = planner.Rank(int8);
  EXPECT_EQ(plan.modes.front(), MigrationMode::kFullKv);
  EXPECT_NE(plan.reason.find("full_kv 0.76"), std::string::npos) << plan.reason;
}

}  // namespace
}  // namespace riskkv
