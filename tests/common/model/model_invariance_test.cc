// The engine is batch-invariant: a token's logits and KV rows are the same bits whether its
// history was prefilled at once, in a shorter prefill followed by decode steps, or with another
// thread count, in both activation precisions and with either KV dtype, and whether the CPU's
// Q4_1 and Q8_0 panel kernels or the row kernel multiply (int8 on an AVX-512 VNNI CPU). This is
// what makes a FULL_KV or TOKEN_REPLAY migration exact.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>

#include "common/model/model.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> out(n);
  for (auto& t : out) t = id(rng);
  return out;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Every layer's K and V rows [0, n) as bytes.
std::string CacheBytes(const KvCache& cache, int64_t n) {
  std::string out;
  for (int64_t l = 0; l < cache.n_layers(); ++l) {
    for (const KvView& view : {cache.KeyView(l, n), cache.ValueView(l, n)}) {
      const int64_t bytes = RowBytes(view.dtype, n * cache.n_kv_heads() * cache.head_dim());
      out.append(static_cast<const char*>(view.data), bytes);
    }
  }
  return out;
}

struct Outcome {
  std::vector<float> logits;  // after the last token
  std::string kv;
  NllResult nll;  // teacher-forced on `continuation` afterwards
};

// Prefills `tokens` in pieces of `split` (the rest one decode step at a time), then scores a
// continuation teacher-forced.
Outcome Drive(Model& model, std::span<const int32_t> tokens, int64_t prefill,
              std::span<const int32_t> continuation, DType kv_dtype) {
  Outcome run;
  auto cache =
      model.NewKvCache(static_cast<int64_t>(tokens.size() + continuation.size()), kv_dtype);
  EXPECT_TRUE(cache.ok()) << cache.status();
  auto logits = model.Prefill(tokens.first(prefill), **cache);
  EXPECT_TRUE(logits.ok()) << logits.status();
  for (size_t i = prefill; i < tokens.size(); ++i) {
    logits = model.Decode(tokens[i], **cache);
    EXPECT_TRUE(logits.ok()) << logits.status();
  }
  run.logits = *logits;
  run.kv = CacheBytes(**cache, static_cast<int64_t>(tokens.size()));
  auto nll = model.TeacherForcedNll(continuation, **cache, run.logits);
  EXPECT_TRUE(nll.ok()) << nll.status();
  run.nll = *nll;
  return run;
}

class ModelInvarianceTest
    : public ::testing::TestWithParam<std::tuple<std::string, ActivationPrecision, DType>> {};

TEST_P(ModelInvarianceTest, PrefillEqualsShorterPrefillPlusDecodeSteps) {
  const auto [name, precision, kv_dtype] = GetParam();
  const fs::path path =
      name == "smollm2" ? testing::DefaultModelPath() : testing::TestdataDir() / name;
  // A history that crosses the engine's 256-token micro-batch and 128-query attention block.
  const int64_t n = name == "smollm2" ? 300 : 60;
  std::vector<Outcome> runs;  // the first: one prefill of the whole history on 2 threads
  std::vector<std::string> labels;
  for (int threads : {2, 1}) {
    // The one-thread model multiplies with the row kernel only (no panels).
    auto model = Model::Load(
        path.string(), {.threads = threads, .activations = precision, .cpu_panels = threads == 2});
    ASSERT_TRUE(model.ok()) << model.status();
    const auto tokens = RandomTokens(n, (*model)->config().vocab, 7);
    const auto continuation = RandomTokens(20, (*model)->config().vocab, 8);
    // SmolLM2 decodes 40 tokens token by token; the tiny models their whole history.
    const int64_t shortest = name == "smollm2" ? n - 40 : 1;
    const std::vector<int64_t> prefills = threads == 2
                                              ? std::vector<int64_t>{n, n - 1, n - 5, shortest}
                                              : std::vector<int64_t>{n - 3};
    for (int64_t prefill : prefills) {
      runs.push_back(Drive(**model, tokens, prefill, continuation, kv_dtype));
      labels.push_back("threads=" + std::to_string(threads) +
                       (threads == 2 ? "" : " without panels") + " prefill " +
                       std::to_string(prefill) + " + " + std::to_string(n - prefill) + " decodes");
    }
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    EXPECT_TRUE(SameBits(runs[i].logits, runs[0].logits)) << labels[i] << " logits differ";
    EXPECT_TRUE(runs[i].kv == runs[0].kv) << labels[i] << " KV rows differ";
    ASSERT_EQ(runs[i].nll.nll.size(), runs[0].nll.nll.size());
    for (size_t t = 0; t < runs[0].nll.nll.size(); ++t) {
      EXPECT_EQ(runs[i].nll.nll[t], runs[0].nll.nll[t]) << labels[i] << " NLL of token " << t;
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<ModelInvarianceTest::ParamType>& info) {
  std::string name = std::get<0>(info.param);
  name = name.substr(0, name.find('.'));
  return name + (std::get<1>(info.param) == ActivationPrecision::kInt8 ? "_int8" : "_f32act") +
         (std::get<2>(info.param) == DType::kF16 ? "_f16kv" : "_f32kv");
}

INSTANTIATE_TEST_SUITE_P(
    Tiny, ModelInvarianceTest,
    ::testing::Combine(::testing::Values("tiny_llama_q4_1.gguf", "tiny_llama_q8_0.gguf",
                                         "tiny_qwen2.gguf", "tiny_llama_bf16.gguf",
                                         "tiny_llama_kquant.gguf"),
                       ::testing::Values(ActivationPrecision::kInt8, ActivationPrecision::kF32),
                       ::testing::Values(DType::kF16, DType::kF32)),
    CaseName);

// SmolLM2 with the nodes' f16 KV cache, in both precisions.
INSTANTIATE_TEST_SUITE_P(SmolLM2, ModelInvarianceTest,
                         ::testing::Combine(::testing::Values("smollm2"),
                                            ::testing::Values(ActivationPrecision::kInt8,
                                                              ActivationPrecision::kF32),
                                            ::testing::Values(DType::kF16)),
                         CaseName);

}  // namespace
}  // namespace riskkv
