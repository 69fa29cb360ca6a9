// A policy's ladder: its rungs, their lower convex hull (against a brute-force check of every
// rung), the policy at a rung, and the checks on rungs in Validate.
#include "common/recovery/policy_ladder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

namespace riskkv {
namespace {

RetentionPolicy::PathPoint Point(const char* form, int32_t groups, double sent, double mean,
                                 bool in_bank) {
  return {.groups = groups,
          .kv_omitted_fraction = 0,
          .delta_nll = {.mean = mean, .requests = 32},
          .wire_form = form,
          .kv_sent_fraction = sent,
          .in_bank = in_bank};
}

// 10 layers; three candidate groups ranked L4-5, L1-2, L7-8 (anchors never rebuilt); the policy
// sends int4 and rebuilds the first group; its path holds int8/int4 points, some in the bank.
RetentionPolicy Ladder() {
  RetentionPolicy p;
  p.model_fingerprint = std::string(64, 'a');
  p.policy_id = "ladder";
  p.version = 1;
  p.epsilon = 0.005;
  p.gate = "upper90";
  p.singleton_risks = {{{{4, 5}, {3, 6}}, {.mean = 0.001}},
                       {{{1, 2}, {0, 3}}, {.mean = 0.002}},
                       {{{7, 8}, {6, 9}}, {.mean = 0.004}}};
  p.rebuilt_groups = {p.singleton_risks[0].group};
  p.kept_layers = {0, 1, 2, 3, 6, 7, 8, 9};
  p.wire_form = "int4";
  p.kv_bytes_per_token = 10 * 2 * 64 * 2;
  p.kv_bytes_saved_per_token = p.kv_bytes_per_token * 3 / 4;
  p.predictor_bank_sha256 = std::string(64, 'b');
  p.path = {Point("int8", 0, 0.55, -0.001, true), Point("int4", 0, 0.30, 0.0028, true),
            Point("int4", 1, 0.24, 0.003, true),  Point("int4", 2, 0.18, 0.020, true),
            Point("int4", 3, 0.12, 0.030, true),  Point("int8", 1, 0.44, 0.001, false),
            Point("int8", 2, 0.33, 0.0005, false)};
  return p;
}

TEST(PolicyLadder, RungsAreExactKvTheOwnConfigurationAndThePointsInTheBank) {
  const RetentionPolicy p = Ladder();
  ASSERT_TRUE(p.Validate(10).ok()) << p.Validate(10);
  const std::vector<Rung> rungs = PolicyRungs(p);
  std::vector<std::pair<WireForm, int32_t>> got;
  for (const Rung& r : rungs) got.push_back({r.form, r.groups});
  // By ascending bytes; the int8 points outside the bank are not rungs.
  EXPECT_EQ(got, (std::vector<std::pair<WireForm, int32_t>>{{WireForm::kInt4, 3},
                                                            {WireForm::kInt4, 2},
                                                            {WireForm::kInt4, 1},
                                                            {WireForm::kInt4, 0},
                                                            {WireForm::kInt8, 0},
                                                            {WireForm::kPlain, 0}}));
  EXPECT_EQ(rungs.back().sent_fraction, 1.0);
  EXPECT_EQ(rungs.back().delta_nll.mean, 0.0);
  EXPECT_EQ(rungs.back().path_index, -1);
  // The own configuration carries its path point's figures.
  EXPECT_EQ(rungs[2].path_index, 2);
  EXPECT_EQ(rungs[2].delta_nll.mean, 0.003);

  // An old policy (no point in the bank) has two rungs: exact KV and its own configuration,
  // with its test figures when its path lacks it.
  RetentionPolicy old = p;
  old.path.clear();
  old.test_delta_nll = {.mean = 0.0042, .requests = 8};
  const std::vector<Rung> two = PolicyRungs(old);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].form, WireForm::kInt4);
  EXPECT_EQ(two[0].groups, 1);
  EXPECT_DOUBLE_EQ(two[0].sent_fraction, 0.25);
  EXPECT_EQ(two[0].delta_nll.mean, 0.0042);
}

TEST(PolicyLadder, TheHullKeepsTheConvexFrontOfBytesAgainstDamage) {
  const std::vector<Rung> hull = LowerHull(PolicyRungs(Ladder()));
  std::vector<std::pair<WireForm, int32_t>> got;
  for (const Rung& r : hull) got.push_back({r.form, r.groups});
  // int4 k=2 (0.18, 0.020) lies above the segment from k=3 (0.12, 0.030) to k=1 (0.24, 0.003);
  // int4 k=0 (0.30, 0.0028) above k=1 to int8 (0.55, -0.001); exact KV (1.0, 0) costs more
  // bytes for more damage than int8.
  EXPECT_EQ(got, (std::vector<std::pair<WireForm, int32_t>>{
                     {WireForm::kInt4, 3}, {WireForm::kInt4, 1}, {WireForm::kInt8, 0}}));
}

// Against brute force: a rung is on the hull exactly when no other rung is at most as costly and
// no more damaging (with one strictly better), and no two others bracket it with a segment below
// it (a rung on such a segment stays: the same rate of damage per byte, finer steps).
TEST(PolicyLadder, TheHullMatchesABruteForceCheckOnRandomLadders) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> x(0.0, 1.0), y(-0.01, 0.05);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<Rung> rungs;
    const int n = 1 + static_cast<int>(rng() % 9);
    for (int i = 0; i < n; ++i) {
      // Coarse values make ties in bytes and in damage common.
      rungs.push_back({.form = WireForm::kInt4,
                       .groups = i,
                       .sent_fraction = std::round(x(rng) * 8) / 8,
                       .delta_nll = {.mean = std::round(y(rng) * 400) / 400}});
    }
    const std::vector<Rung> hull = LowerHull(rungs);
    for (const Rung& r : rungs) {
      bool dominated = false, above = false;
      for (const Rung& o : rungs) {
        if (o.groups == r.groups) continue;
        if (o.sent_fraction <= r.sent_fraction && o.delta_nll.mean <= r.delta_nll.mean &&
            (o.sent_fraction < r.sent_fraction || o.delta_nll.mean < r.delta_nll.mean ||
             o.groups < r.groups)) {
          dominated = true;
        }
        for (const Rung& q : rungs) {
          if (q.groups == r.groups || q.groups == o.groups) continue;
          if (!(o.sent_fraction < r.sent_fraction && r.sent_fraction < q.sent_fraction)) continue;
          const double t =
              (r.sent_fraction - o.sent_fraction) / (q.sent_fraction - o.sent_fraction);
          const double line = o.delta_nll.mean + t * (q.delta_nll.mean - o.delta_nll.mean);
          if (line < r.delta_nll.mean - 1e-12) above = true;
        }
      }
      const bool in_hull = std::any_of(hull.begin(), hull.end(),
                                       [&](const Rung& h) { return h.groups == r.groups; });
      // Exact duplicates: the hull keeps one of them (the first in sorted order).
      const bool duplicate = std::any_of(rungs.begin(), rungs.end(), [&](const Rung& o) {
        return o.groups != r.groups && o.sent_fraction == r.sent_fraction &&
               o.delta_nll.mean == r.delta_nll.mean;
      });
      if (duplicate) continue;
      EXPECT_EQ(in_hull, !dominated && !above)
          << "trial " << trial << " rung " << r.groups << " (" << r.sent_fraction << ", "
          << r.delta_nll.mean << ")" << [&] {
               std::string s;
               for (const Rung& o : rungs) {
                 s += " (" + std::to_string(o.sent_fraction) + "," +
                      std::to_string(o.delta_nll.mean) + ")";
               }
               return s;
             }();
    }
    for (size_t i = 1; i < hull.size(); ++i) {
      EXPECT_GT(hull[i].sent_fraction, hull[i - 1].sent_fraction);
      EXPECT_LT(hull[i].delta_nll.mean, hull[i - 1].delta_nll.mean);
    }
  }
}

TEST(PolicyLadder, ThePolicyAtARungKeepsAndRebuildsThatRungsLayers) {
  const RetentionPolicy p = Ladder();
  auto k2 = PolicyAtRung(p, WireForm::kInt4, 2);
  ASSERT_TRUE(k2.ok()) << k2.status();
  EXPECT_EQ(k2->kept_layers, (std::vector<int32_t>{0, 3, 6, 7, 8, 9}));
  ASSERT_EQ(k2->rebuilt_groups.size(), 2u);
  EXPECT_EQ(k2->rebuilt_groups[0].targets, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(k2->rebuilt_groups[1].targets, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(k2->wire_form, "int4");
  EXPECT_EQ(k2->policy_id, p.policy_id);
  EXPECT_EQ(k2->predictor_bank_sha256, p.predictor_bank_sha256);
  EXPECT_EQ(k2->kv_bytes_saved_per_token, std::llround(p.kv_bytes_per_token * 0.82));
  EXPECT_TRUE(k2->Validate(10).ok()) << k2->Validate(10);

  auto int8 = PolicyAtRung(p, WireForm::kInt8, 0);
  ASSERT_TRUE(int8.ok());
  EXPECT_TRUE(int8->rebuilt_groups.empty());
  EXPECT_EQ(int8->kept_layers.size(), 10u);
  EXPECT_EQ(int8->wire_form, "int8");

  // Its own configuration comes back as it is.
  auto own = PolicyAtRung(p, WireForm::kInt4, 1);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(*own, p);

  // Measured but not in the bank, never measured, or beyond the ranking: refused, naming the
  // ladder.
  for (auto [form, k] : {std::pair{WireForm::kInt8, 1}, std::pair{WireForm::kTransform, 0},
                         std::pair{WireForm::kInt4, 4}, std::pair{WireForm::kInt4, -1}}) {
    auto r = PolicyAtRung(p, form, k);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << WireFormName(form) << k;
    EXPECT_NE(r.status().message().find("is not a rung of policy ladder v1"), std::string::npos);
    EXPECT_NE(r.status().message().find("int4 k=3 (12.0% of the KV"), std::string::npos)
        << r.status();
  }
}

TEST(PolicyLadder, ValidateChecksTheRungsAndTheirBank) {
  ASSERT_TRUE(Ladder().Validate(10).ok());
  RetentionPolicy beyond = Ladder();
  beyond.path[3].groups = 4;  // a ranking of 3
  EXPECT_NE(beyond.Validate(10).message().find("path point 3 rebuilds 4 groups of a ranking of 3"),
            std::string::npos)
      << beyond.Validate(10);
  RetentionPolicy negative = Ladder();
  negative.path[5].groups = -1;
  EXPECT_EQ(negative.Validate(10).code(), absl::StatusCode::kInvalidArgument);
  // A ranking whose first groups rebuild an anchor of one another makes no rung.
  RetentionPolicy overlap = Ladder();
  overlap.singleton_risks[1].group = {{3}, {2, 4}};
  EXPECT_NE(overlap.Validate(10).message().find("path point 3"), std::string::npos)
      << overlap.Validate(10);
  // A policy that rebuilds nothing itself still needs its bank for its rungs that do.
  RetentionPolicy exact = Ladder();
  exact.rebuilt_groups.clear();
  exact.kept_layers = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  exact.kv_bytes_saved_per_token = exact.kv_bytes_per_token * 7 / 10;
  EXPECT_TRUE(PolicyNeedsBank(exact));
  exact.predictor_bank_sha256.clear();
  EXPECT_NE(exact.Validate(10).message().find("predictor_bank_sha256 is empty"), std::string::npos)
      << exact.Validate(10);
  for (auto& pt : exact.path) pt.in_bank = pt.groups == 0;
  EXPECT_FALSE(PolicyNeedsBank(exact));
  EXPECT_TRUE(exact.Validate(10).ok()) << exact.Validate(10);
}

}  // namespace
}  // namespace riskkv
