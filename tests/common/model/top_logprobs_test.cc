// Top-token references: their order, the KL divergence against them (equal to the full KL when
// the reference holds the whole vocabulary, a lower bound otherwise, checked against a direct
// sum), top-1 agreement, and the checks on references from outside.
#include "common/model/top_logprobs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace riskkv {
namespace {

std::vector<double> Softmax(const std::vector<float>& logits) {
  double m = -1e300, z = 0;
  for (float v : logits) m = std::max(m, static_cast<double>(v));
  std::vector<double> p(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i] - m);
  for (double& v : p) v /= z;
  return p;
}

// KL(p || q) summed directly over every token.
double FullKl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  const std::vector<double> p = Softmax(p_logits), q = Softmax(q_logits);
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) kl += p[i] * std::log(p[i] / q[i]);
  return kl;
}

TEST(TopLogProbs, MostLikelyFirstLowestIdAmongEqualsNanLast) {
  const std::vector<float> logits = {1.0f, 3.0f, std::nanf(""), 3.0f, -2.0f};
  std::vector<int32_t> ids(5);
  std::vector<float> logp(5);
  TopLogProbs(logits, 5, ids.data(), logp.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 0, 4, 2}));
  // Log-probabilities are the log-softmax over the whole row.
  const std::vector<float> clean = {1.0f, 3.0f, 3.0f, -2.0f};
  std::vector<int32_t> cids(2);
  std::vector<float> clogp(2);
  TopLogProbs(clean, 2, cids.data(), clogp.data());
  const std::vector<double> p = Softmax(clean);
  EXPECT_EQ(cids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(clogp[0], std::log(p[1]), 1e-6);
  EXPECT_NEAR(clogp[1], std::log(p[2]), 1e-6);
}

TEST(TopLogProbs, KlIsTheFullKlWithTheWholeVocabularyAndALowerBoundWithout) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int vocab = 2 + static_cast<int>(rng() % 120);
    std::vector<float> p(vocab), q(vocab);
    for (int i = 0; i < vocab; ++i) {
      p[i] = n(rng);
      q[i] = p[i] + 0.3f * n(rng);
    }
    const double full = FullKl(p, q);
    std::vector<int32_t> ids(vocab);
    std::vector<float> logp(vocab);
    TopLogProbs(p, vocab, ids.data(), logp.data());
    EXPECT_NEAR(TopKl(ids, logp, q), full, 1e-5 + 1e-5 * full) << trial;
    const int k = 1 + static_cast<int>(rng() % vocab);
    TopLogProbs(p, k, ids.data(), logp.data());
    const double bound =
        TopKl(std::span<const int32_t>(ids.data(), k), std::span<const float>(logp.data(), k), q);
    EXPECT_GE(bound, 0.0);
    EXPECT_LE(bound, full + 1e-5) << trial << " k=" << k;
    // Against itself: nothing but rounding.
    EXPECT_LT(
        TopKl(std::span<const int32_t>(ids.data(), k), std::span<const float>(logp.data(), k), p),
        1e-6);
    EXPECT_TRUE(TopAgrees(std::span<const int32_t>(ids.data(), k), p));
  }
  // A different most likely token disagrees.
  const std::vector<float> a = {0.0f, 5.0f, 1.0f}, b = {5.0f, 0.0f, 1.0f};
  std::vector<int32_t> ids(1);
  std::vector<float> logp(1);
  TopLogProbs(a, 1, ids.data(), logp.data());
  EXPECT_FALSE(TopAgrees(ids, b));
  EXPECT_GT(TopKl(ids, logp, b), 4.0);
  // Logits that hold NaN give a NaN divergence, never a reassuring 0.
  EXPECT_TRUE(std::isnan(TopKl(ids, logp, std::vector<float>{0.0f, std::nanf(""), 1.0f})));
}

TEST(TopLogProbs, ReferencesFromOutsideAreChecked) {
  const std::vector<int32_t> ids = {5, 2, 9};
  const std::vector<float> logp = {-0.5f, -2.0f, -3.0f};
  EXPECT_TRUE(CheckTopLogProbs(ids, logp, 10).ok());
  struct Case {
    std::vector<int32_t> ids;
    std::vector<float> logp;
    const char* needle;
  };
  const std::vector<int32_t> many(kTopTokens + 1, 0);
  const std::vector<float> many_logp(kTopTokens + 1, -10.0f);
  const Case cases[] = {
      {{}, {}, "0 reference tokens"},
      {many, many_logp, "65 reference tokens"},
      {{5, 2}, {-0.2f}, "2 reference tokens with 1 log-probabilities"},
      {{5, 10}, {-0.2f, -1.0f}, "reference token 10 is outside the vocabulary of 10"},
      {{-1, 2}, {-0.2f, -1.0f}, "reference token -1"},
      {{5, 5}, {-0.2f, -1.0f}, "listed twice"},
      {{5, 2}, {0.5f, -1.0f}, "0.5 is not a finite value <= 0"},
      {{5, 2}, {std::nanf(""), -1.0f}, "is not a finite value"},
      {{5, 2}, {-0.1f, -0.2f}, "sum to"},
      {{5, 2}, {-2.0f, -1.0f}, "not most likely first (-2 then -1)"},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckTopLogProbs(c.ids, c.logp, 10);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.needle;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace riskkv
