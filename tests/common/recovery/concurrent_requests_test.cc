// MeasureNll and MeasureNllWith scoring requests concurrently on the tiny model, small enough to
// run under ThreadSanitizer (label "threads"): the numbers of one request at a time.
#include "tests/common/recovery/concurrent_requests.h"

#include <gtest/gtest.h>

#include "common/model/model_fingerprint.h"
#include "common/recovery/calibration.h"
#include "common/recovery/predictor_bank.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

using testing::ExpectConcurrentRequestsMatch;

// A real rebuild on the workers' backends (folded maps through the backend's MatMul and RoPE)
// gives the sequential numbers.
TEST(MeasureNll, RebuildsOnConcurrentRequestsMatchOneAtATime) {
  const std::string path = (testing::TestdataDir() / "tiny_llama_deep.gguf").string();
  auto one = Model::Load(path, {.threads = 1, .activations = ActivationPrecision::kF32});
  auto many = Model::Load(path, {.threads = 3, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(one.ok() && many.ok());
  std::vector<int32_t> tokens(10 * 36);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 53 + 7) % 500);
  const auto requests = MakeRequests(tokens, 24, 12, 0);
  const std::span<const Request> all(requests);
  auto groups = CandidateGroups(static_cast<int32_t>((*one)->config().n_layers), {});
  ASSERT_TRUE(groups.ok() && !groups->empty());
  auto fits = FitGroups(**one, all.first(4), all.subspan(4, 2), *groups);
  ASSERT_TRUE(fits.ok()) << fits.status();
  auto fingerprint = ModelFingerprint(**one);
  ASSERT_TRUE(fingerprint.ok());
  auto bank = PredictorBank::FromFits(*fingerprint, DType::kF16, *fits);
  ASSERT_TRUE(bank.ok()) << bank.status();
  std::vector<std::vector<int>> configs = {{}};
  for (size_t g = 0; g < (*bank)->groups().size(); ++g) configs.push_back({static_cast<int>(g)});
  auto sequential = MeasureNll(**one, all.subspan(6), (*bank)->groups(), configs);
  auto concurrent = MeasureNll(**many, all.subspan(6), (*bank)->groups(), configs);
  ASSERT_TRUE(sequential.ok() && concurrent.ok());
  EXPECT_EQ(*concurrent, *sequential);
  EXPECT_NE((*sequential)[1], (*sequential)[0]);
}

TEST(MeasureNllWith, ConcurrentRequestsMatchOneAtATime) {
  ExpectConcurrentRequestsMatch((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                                ActivationPrecision::kF32, 3, 24, 12, 7, {{}, {1}, {5, 3}, {0}});
}

}  // namespace
}  // namespace riskkv
