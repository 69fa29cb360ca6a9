// Greedy and stochastic sampling, determinism by seed, and resuming from a saved RNG state.
#include "common/model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace riskkv {
namespace {

std::vector<float> Logits() { return {0.5f, 2.0f, -1.0f, 1.5f, 0.0f, 2.0f}; }

TEST(Sampler, GreedyPicksFirstMaximum) {
  auto s = Sampler::Create({});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->Sample(Logits()), 1);
  EXPECT_EQ(Argmax(Logits()), 1);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  auto k1 = Sampler::Create({.temperature = 1.0f, .top_k = 1, .seed = 3});
  auto p0 = Sampler::Create({.temperature = 1.0f, .top_p = 1e-6f, .seed = 3});
  ASSERT_TRUE(k1.ok() && p0.ok());
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(k1->Sample(Logits()), 1);
    EXPECT_EQ(p0->Sample(Logits()), 1);
  }
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  const auto logits = Logits();
  const float temperature = 0.7f;
  auto s = Sampler::Create({.temperature = temperature, .seed = 42});
  ASSERT_TRUE(s.ok());
  const int draws = 40000;
  std::map<int, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[s->Sample(logits)];
  double z = 0;
  for (float l : logits) z += std::exp(l / temperature);
  for (int id = 0; id < static_cast<int>(logits.size()); ++id) {
    const double p = std::exp(logits[id] / temperature) / z;
    // 5 standard deviations of a binomial proportion.
    EXPECT_NEAR(counts[id] / static_cast<double>(draws), p,
                5 * std::sqrt(p * (1 - p) / draws) + 1e-4)
        << "token " << id;
  }
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  auto k2 = Sampler::Create({.temperature = 5.0f, .top_k = 2, .seed = 1});
  // At T=1 tokens 1 and 5 (tied at 2.0) carry 0.663 together; token 3 (0.201) completes 0.7.
  auto p = Sampler::Create({.temperature = 1.0f, .top_p = 0.7f, .seed = 1});
  ASSERT_TRUE(k2.ok() && p.ok());
  std::map<int, int> k_counts, p_counts;
  for (int i = 0; i < 3000; ++i) {
    ++k_counts[k2->Sample(Logits())];
    ++p_counts[p->Sample(Logits())];
  }
  EXPECT_EQ(k_counts.size(), 2u);
  EXPECT_GT(k_counts[1], 0);
  EXPECT_GT(k_counts[5], 0);
  EXPECT_EQ(p_counts.size(), 3u);
  EXPECT_GT(p_counts[3], 0);
}

TEST(Sampler, SameSeedSameStreamAndStateResumes) {
  const SamplingParams params{.temperature = 1.0f, .top_k = 4, .top_p = 0.95f, .seed = 1234};
  auto a = Sampler::Create(params);
  auto b = Sampler::Create(params);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int> first;
  for (int i = 0; i < 100; ++i) {
    first.push_back(a->Sample(Logits()));
    EXPECT_EQ(b->Sample(Logits()), first.back());
  }
  // Save mid-stream, continue on a fresh sampler (another node) restored from the state.
  const std::string state = a->SaveState();
  auto resumed = Sampler::Create({.temperature = 1.0f, .top_k = 4, .top_p = 0.95f, .seed = 999});
  ASSERT_TRUE(resumed.ok());
  ASSERT_TRUE(resumed->RestoreState(state).ok());
  int differ_from_other_seed = 0;
  auto other = Sampler::Create({.temperature = 1.0f, .top_k = 4, .top_p = 0.95f, .seed = 999});
  for (int i = 0; i < 100; ++i) {
    const int expected = a->Sample(Logits());
    EXPECT_EQ(resumed->Sample(Logits()), expected);
    differ_from_other_seed += other->Sample(Logits()) != expected;
  }
  EXPECT_GT(differ_from_other_seed, 10);
}

TEST(Sampler, RejectsBadParametersAndState) {
  EXPECT_FALSE(Sampler::Create({.top_k = -1}).ok());
  EXPECT_FALSE(Sampler::Create({.top_p = 0.0f}).ok());
  EXPECT_FALSE(Sampler::Create({.top_p = 1.5f}).ok());
  EXPECT_FALSE(Sampler::Create({.temperature = NAN}).ok());
  auto s = Sampler::Create({.temperature = 1.0f, .seed = 5});
  ASSERT_TRUE(s.ok());
  const std::string good = s->SaveState();
  EXPECT_FALSE(s->RestoreState("not a state").ok());
  EXPECT_FALSE(s->RestoreState(good.substr(0, good.size() / 2)).ok());
  EXPECT_FALSE(s->RestoreState(good + " 17").ok());
  EXPECT_EQ(s->SaveState(), good);  // failed restores leave the state unchanged
}

}  // namespace
}  // namespace riskkv
