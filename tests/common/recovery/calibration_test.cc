// Calibration measurements on a tiny model: requests, fitted groups through a bank, and paired
// per-request NLL with and without rebuilt layers.
#include "common/recovery/calibration.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/model/model_fingerprint.h"
#include "common/recovery/predictor_bank.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

TEST(Calibration, MakeRequestsCutsDisjointWindows) {
  std::vector<int32_t> tokens(100);
  for (int i = 0; i < 100; ++i) tokens[i] = i;
  auto r = MakeRequests(tokens, 20, 10, 0);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[1].tokens.front(), 30);
  EXPECT_EQ(r[1].tokens.size(), 30u);
  EXPECT_EQ(r[1].history, 20);
  EXPECT_EQ(MakeRequests(tokens, 20, 10, 2).size(), 2u);
  EXPECT_TRUE(MakeRequests(tokens, 0, 10, 0).empty());
}

TEST(Calibration, ExactConfigurationMatchesPlainScoringAndRebuildIsPaired) {
  auto model = Model::Load((testing::TestdataDir() / "tiny_llama.gguf").string(),
                           {.threads = 2, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok());
  Model& m = **model;
  std::vector<int32_t> tokens(6 * 48);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % 500);
  const auto requests = MakeRequests(tokens, 32, 16, 0);
  ASSERT_EQ(requests.size(), 6u);
  const std::span<const Request> all(requests);

  auto groups = CandidateGroups(static_cast<int32_t>(m.config().n_layers), {});
  ASSERT_TRUE(groups.ok());
  ASSERT_FALSE(groups->empty());
  int64_t last_done = 0, calls = 0;
  auto fits =
      FitGroups(m, all.first(3), all.subspan(3, 1), *groups, [&](int64_t done, int64_t total) {
        EXPECT_EQ(done, last_done + 1);
        EXPECT_LE(done, total);
        last_done = done;
        ++calls;
      });
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_GT(calls, 0);
  auto fingerprint = ModelFingerprint(m);
  ASSERT_TRUE(fingerprint.ok());
  auto bank = PredictorBank::FromFits(*fingerprint, DType::kF32, *fits);
  ASSERT_TRUE(bank.ok()) << bank.status();

  const std::vector<std::vector<int>> configs = {{}, {0}};
  auto nll = MeasureNll(m, all.subspan(4), (*bank)->groups(), configs);
  ASSERT_TRUE(nll.ok()) << nll.status();
  ASSERT_EQ(nll->size(), 2u);
  ASSERT_EQ((*nll)[0].size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    // Rebuilding nothing is the exact cache: bit-identical to scoring the request directly the
    // way a migration target resumes (all history rows but the last, then a decode step).
    const Request& req = requests[4 + r];
    auto cache = m.NewKvCache(req.tokens.size());
    const auto tokens = std::span<const int32_t>(req.tokens);
    ASSERT_TRUE(m.Prefill(tokens.first(req.moved_rows()), **cache).ok());
    auto last = m.Decode(tokens[req.moved_rows()], **cache);
    ASSERT_TRUE(last.ok());
    auto direct = m.TeacherForcedNll(std::span<const int32_t>(req.tokens).subspan(req.history),
                                     **cache, *last);
    ASSERT_TRUE(direct.ok());
    EXPECT_EQ((*nll)[0][r], direct->mean);
    // A random tiny model's layers are not predictable from each other: rebuilding changes the
    // scores, finitely.
    EXPECT_TRUE(std::isfinite((*nll)[1][r]));
    EXPECT_NE((*nll)[1][r], (*nll)[0][r]);
  }
  const std::vector<std::vector<int>> bad = {{7}};
  EXPECT_FALSE(MeasureNll(m, all.subspan(4), (*bank)->groups(), bad).ok());
  EXPECT_FALSE(FitGroups(m, {}, {}, *groups).ok());
}

}  // namespace
}  // namespace riskkv
