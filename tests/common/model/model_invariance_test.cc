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

// Several sessions in one shared pass (Model::ForwardMany, what the engine's Step runs): decode
// steps, a prompt long enough to be cut between two micro-batches and a teacher-forced scoring,
// in any order and at either thread count, give each session the bits it gets alone. A segment
// that fails its checks fails alone.
TEST_P(ModelInvarianceTest, SessionsInOneStepEqualEachAlone) {
  const auto [name, precision, kv_dtype] = GetParam();
  const fs::path path =
      name == "smollm2" ? testing::DefaultModelPath() : testing::TestdataDir() / name;
  const bool big = name == "smollm2";
  auto two = Model::Load(path.string(), {.threads = 2, .activations = precision});
  auto one =
      Model::Load(path.string(), {.threads = 1, .activations = precision, .cpu_panels = false});
  ASSERT_TRUE(two.ok() && one.ok());
  const int64_t vocab = (*two)->config().vocab;
  // Per session: a history prefilled alone first, then this step's tokens.
  struct Case {
    int64_t history;
    int64_t step;
    bool all_logits;
  };
  const std::vector<Case> cases = {
      {big ? 90 : 30, 1, false},   // a decode
      {0, big ? 250 : 40, false},  // a new prompt (cut between micro-batches at SmolLM2's size)
      {big ? 40 : 12, 20, true},   // a scoring
      {big ? 150 : 50, 1, false},  // another decode
      {big ? 10 : 3, 7, false},    // a prefill chunk after a few rows
  };
  const int64_t capacity = big ? 400 : 120;
  std::vector<std::unique_ptr<KvCache>> start;
  std::vector<std::vector<int32_t>> steps;
  for (size_t i = 0; i < cases.size(); ++i) {
    start.push_back(*(*two)->NewKvCache(capacity, kv_dtype));
    const auto history = RandomTokens(cases[i].history, vocab, 100 + i);
    if (!history.empty()) {
      ASSERT_TRUE((*two)->Prefill(history, *start.back()).ok());
    }
    steps.push_back(RandomTokens(cases[i].step, vocab, 200 + i));
  }
  // Alone.
  std::vector<std::vector<float>> logits(cases.size());
  std::vector<std::string> kv(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto cache = *start[i]->Clone();
    ForwardOptions options;
    options.all_logits = cases[i].all_logits;
    ASSERT_TRUE((*two)->Forward(steps[i], *cache, options, &logits[i]).ok());
    kv[i] = CacheBytes(*cache, cache->n_tokens());
  }
  // Together, in two orders, on both models, with two segments that must fail.
  const std::vector<int32_t> bad = {static_cast<int32_t>(vocab)};
  for (Model* model : {two->get(), one->get()}) {
    for (const std::vector<size_t>& order :
         {std::vector<size_t>{0, 1, 2, 3, 4}, std::vector<size_t>{2, 3, 0, 1, 4}}) {
      // At SmolLM2's sizes the first order cuts the scoring at the 256-token micro-batch, the
      // second the prompt.
      std::vector<std::unique_ptr<KvCache>> caches;
      std::vector<std::vector<float>> out(cases.size());
      std::vector<ForwardSegment> segments;
      for (size_t i : order) {
        caches.push_back(*start[i]->Clone());
        segments.push_back({.tokens = steps[i],
                            .cache = caches.back().get(),
                            .all_logits = cases[i].all_logits,
                            .logits = &out[i]});
      }
      auto spare = *start[0]->Clone();
      segments.insert(segments.begin() + 2, {.tokens = bad, .cache = spare.get()});
      segments.push_back({.tokens = steps[0], .cache = caches[0].get()});  // a cache twice
      const std::vector<absl::Status> status = model->ForwardMany(segments);
      ASSERT_EQ(status.size(), segments.size());
      EXPECT_EQ(status[2].code(), absl::StatusCode::kInvalidArgument) << status[2];
      EXPECT_EQ(status.back().code(), absl::StatusCode::kInvalidArgument) << status.back();
      EXPECT_EQ(spare->n_tokens(), start[0]->n_tokens()) << "a failed segment ran";
      for (size_t j = 0; j < order.size(); ++j) {
        const size_t i = order[j];
        const std::string label = "session " + std::to_string(i) + " at " + std::to_string(j) +
                                  (model == one->get() ? ", 1 thread without panels" : "");
        EXPECT_TRUE(status[j < 2 ? j : j + 1].ok()) << label;
        EXPECT_TRUE(SameBits(out[i], logits[i])) << label << ": logits differ";
        EXPECT_TRUE(CacheBytes(*caches[j], caches[j]->n_tokens()) == kv[i])
            << label << ": KV rows differ";
      }
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
