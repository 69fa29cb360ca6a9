// The bootstrap and the gates on hand-made per-request NLL differences.
#include "common/recovery/quality_gate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace riskkv {
namespace {

std::vector<double> Normal(int n, double mean, double sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, sd);
  std::vector<double> v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

double SampleMean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}

double SampleSd(const std::vector<double>& v) {
  const double m = SampleMean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / (v.size() - 1));
}

TEST(Bootstrap, ConstantDeltasGiveADegenerateInterval) {
  const std::vector<double> d(50, 0.004);
  auto ci = BootstrapMeanInterval(d, 0.95);
  ASSERT_TRUE(ci.ok());
  EXPECT_DOUBLE_EQ(ci->mean, 0.004);
  EXPECT_NEAR(ci->lo, 0.004, 1e-15);
  EXPECT_NEAR(ci->hi, 0.004, 1e-15);
}

TEST(Bootstrap, MatchesTheNormalApproximationForLargeSamples) {
  const auto d = Normal(400, 0.01, 0.05, 1);
  const double se = SampleSd(d) / std::sqrt(400.0);
  auto ci = BootstrapMeanInterval(d, 0.95, {.resamples = 20000, .seed = 3});
  ASSERT_TRUE(ci.ok());
  EXPECT_NEAR(ci->mean, SampleMean(d), 1e-12);
  EXPECT_NEAR(ci->hi - ci->mean, 1.96 * se, 0.1 * 1.96 * se);
  EXPECT_NEAR(ci->mean - ci->lo, 1.96 * se, 0.1 * 1.96 * se);
  auto ub = BootstrapUpperBound(d, 0.9, {.resamples = 20000, .seed = 3});
  ASSERT_TRUE(ub.ok());
  EXPECT_NEAR(*ub - SampleMean(d), 1.2816 * se, 0.1 * 1.2816 * se);
  EXPECT_LT(*ub, ci->hi);  // one-sided 90% sits inside the two-sided 95% interval
}

TEST(Bootstrap, DeterministicForASeed) {
  const auto d = Normal(30, 0.0, 1.0, 2);
  EXPECT_EQ(*BootstrapUpperBound(d, 0.9, {.seed = 7}), *BootstrapUpperBound(d, 0.9, {.seed = 7}));
  EXPECT_NE(*BootstrapUpperBound(d, 0.9, {.seed = 7}), *BootstrapUpperBound(d, 0.9, {.seed = 8}));
}

TEST(Bootstrap, RejectsBadInput) {
  EXPECT_FALSE(BootstrapMeanInterval({}, 0.95).ok());
  const std::vector<double> nan = {0.1, NAN};
  EXPECT_FALSE(BootstrapMeanInterval(nan, 0.95).ok());
  const std::vector<double> ok = {0.1, 0.2};
  EXPECT_FALSE(BootstrapMeanInterval(ok, 1.0).ok());
  EXPECT_FALSE(BootstrapUpperBound(ok, 0.0).ok());
  EXPECT_FALSE(BootstrapUpperBound(ok, 0.9, {.resamples = 5}).ok());
}

// `n` values alternating mean + spread and mean - spread: sample mean exactly `mean`.
std::vector<double> Alternating(int n, double mean, double spread) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = mean + (i % 2 ? -spread : spread);
  return v;
}

// A path of growing configurations: the first two are within 0.005 on average, the second with
// a wide spread (standard error 0.0039) and over budget on the independent requests; the third
// is over budget everywhere.
std::vector<PathPoint> HandMadePath() {
  std::vector<PathPoint> path(3);
  path[0] = {0.10, Alternating(60, 0.001, 0.002), Alternating(60, 0.001, 0.002), {}, {}};
  path[1] = {0.20, Alternating(60, 0.003, 0.030), std::vector<double>(60, 0.009), {}, {}};
  path[2] = {0.30, std::vector<double>(60, 0.012), std::vector<double>(60, 0.012), {}, {}};
  return path;
}

TEST(Gates, EachGateChoosesAsItsRuleSays) {
  const auto path = HandMadePath();

  auto mean = ApplyGate(Gate::kMean, path, 0.005);
  ASSERT_TRUE(mean.ok());
  EXPECT_EQ(mean->chosen, 1);  // largest point whose mean is within budget
  EXPECT_EQ(mean->passed, (std::vector<bool>{true, true, false}));

  auto upper = ApplyGate(Gate::kUpper90, path, 0.005);
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(upper->chosen, 0);  // point 1's spread puts its upper bound over budget
  EXPECT_GT(upper->statistic[1], 0.005);
  EXPECT_GT(upper->statistic[1], mean->statistic[1]);

  auto split = ApplyGate(Gate::kStableSplit, path, 0.005);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->chosen, 0);  // point 1 fails on the independent requests
}

TEST(Gates, StableSplitIsUpper90PlusAnIndependentCheck) {
  std::vector<PathPoint> path(2);
  // Tight and within budget on selection, over budget on the independent requests.
  path[0] = {0.10, Alternating(60, 0.001, 0.0005), std::vector<double>(60, 0.007), {}, {}};
  // Within budget on both means, but too noisy on selection for the upper bound.
  path[1] = {0.20, Alternating(60, 0.004, 0.030), std::vector<double>(60, 0.001), {}, {}};
  auto upper = ApplyGate(Gate::kUpper90, path, 0.005);
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(upper->passed, (std::vector<bool>{true, false}));
  auto split = ApplyGate(Gate::kStableSplit, path, 0.005);
  ASSERT_TRUE(split.ok());
  EXPECT_EQ(split->passed, (std::vector<bool>{false, false}));
  EXPECT_EQ(split->chosen, -1);
  EXPECT_NEAR(split->statistic[0], 0.007, 1e-12);              // the confirmation mean decides
  EXPECT_DOUBLE_EQ(split->statistic[1], upper->statistic[1]);  // the upper bound decides
}

TEST(Gates, FallBackToExactKvWhenNothingPasses) {
  auto d = ApplyGate(Gate::kMean, HandMadePath(), 0.0001);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->chosen, -1);
  auto empty = ApplyGate(Gate::kUpper90, {}, 0.005);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->chosen, -1);
}

TEST(Gates, PicksTheMostKvSavedNotTheLastPassing) {
  std::vector<PathPoint> path = {{0.25, {0.001, 0.002}, {}, {}, {}},
                                 {0.15, {0.001, 0.001}, {}, {}, {}}};
  auto d = ApplyGate(Gate::kMean, path, 0.005);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->chosen, 0);
}

TEST(Gates, SeveralKindsAreGatedByTheWorstKind) {
  // Kind 0 is safe and tight; kind 1, half as many requests, is over budget on its own. Pooled,
  // the point would pass; by kind it fails, and kind 1 is named.
  std::vector<double> deltas, confirm;
  std::vector<int> kinds, confirm_kinds;
  for (int i = 0; i < 40; ++i) {
    deltas.push_back(i % 2 ? 0.0010 : 0.0012);
    kinds.push_back(0);
  }
  std::vector<double> hard;
  for (int i = 0; i < 20; ++i) {
    deltas.push_back(i % 2 ? 0.006 : 0.008);
    kinds.push_back(1);
    hard.push_back(deltas.back());
  }
  for (int i = 0; i < 6; ++i) {
    confirm.push_back(0.001);
    confirm_kinds.push_back(i % 2);
  }
  const std::vector<PathPoint> path = {{0.2, deltas, confirm, kinds, confirm_kinds}};
  const std::vector<PathPoint> pooled = {{0.2, deltas, confirm, {}, {}}};
  auto pooled_mean = ApplyGate(Gate::kMean, pooled, 0.005);
  ASSERT_TRUE(pooled_mean.ok());
  EXPECT_TRUE(pooled_mean->passed[0]);
  for (Gate g : {Gate::kMean, Gate::kUpper90, Gate::kStableSplit}) {
    auto d = ApplyGate(g, path, 0.005);
    ASSERT_TRUE(d.ok()) << GateName(g);
    EXPECT_FALSE(d->passed[0]) << GateName(g);
    EXPECT_EQ(d->worst_kind[0], 1) << GateName(g);
  }
  auto upper = ApplyGate(Gate::kUpper90, path, 0.005);
  auto alone = BootstrapUpperBound(hard, 0.9);
  ASSERT_TRUE(upper.ok() && alone.ok());
  EXPECT_EQ(upper->statistic[0], *alone);  // kind 1's own bound, nothing pooled
  auto mean = ApplyGate(Gate::kMean, path, 0.005);
  EXPECT_NEAR(mean->statistic[0], 0.007, 1e-12);

  // Every kind needs requests, and kinds must match the requests.
  std::vector<PathPoint> missing = path;
  missing[0].confirm_kinds.assign(6, 0);
  EXPECT_FALSE(ApplyGate(Gate::kStableSplit, missing, 0.005).ok());
  std::vector<PathPoint> short_kinds = path;
  short_kinds[0].kinds.pop_back();
  EXPECT_FALSE(ApplyGate(Gate::kMean, short_kinds, 0.005).ok());
}

TEST(Gates, RejectsBadInput) {
  EXPECT_FALSE(ApplyGate(Gate::kMean, HandMadePath(), -1.0).ok());
  std::vector<PathPoint> no_confirm = {{0.1, {0.001}, {}, {}, {}}};
  EXPECT_FALSE(ApplyGate(Gate::kStableSplit, no_confirm, 0.005).ok());
  std::vector<PathPoint> no_deltas = {{0.1, {}, {}, {}, {}}};
  EXPECT_FALSE(ApplyGate(Gate::kMean, no_deltas, 0.005).ok());
}

}  // namespace
}  // namespace riskkv
