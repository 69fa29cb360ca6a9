// The Engine interface on the CPU (and on the GPU where one is usable, against the CPU): the
// KV store's rows in and out, copies, ownership checks, the resume of a received session, the
// rebuild of a group, and the choice CreateEngine makes.
#include "common/engine/engine.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "common/engine/cpu_engine.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/rebuild.h"
#include "kernels/gpu.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

std::unique_ptr<Model> LoadTiny() {
  auto m = Model::Load((testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                       {.threads = 1, .activations = ActivationPrecision::kF32});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + 11) % 500;
  return t;
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadTiny();
    ASSERT_NE(model_, nullptr);
    engine_ = std::make_unique<CpuEngine>(*model_, DType::kF32);
    engine16_ = std::make_unique<CpuEngine>(*model_, DType::kF16);
  }
  std::unique_ptr<Model> model_;
  std::unique_ptr<CpuEngine> engine_;    // f32 rows
  std::unique_ptr<CpuEngine> engine16_;  // f16 rows
};

TEST_F(EngineTest, ChecksTokenIdsOnceForEveryCaller) {
  EXPECT_TRUE(engine_->CheckTokenIds(Tokens(8)).ok());
  const std::vector<int32_t> bad = {1, 2, static_cast<int32_t>(engine_->config().vocab)};
  const absl::Status st = engine_->CheckTokenIds(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("at index 2"), std::string_view::npos) << st;
  auto kv = *engine_->NewStore(64);
  EXPECT_EQ(engine_->Prefill(bad, *kv).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, PrefillAndDecodeMatchTheModelBitForBit) {
  auto kv = *engine_->NewStore(64);
  auto cache = *model_->NewKvCache(64, DType::kF32);
  const auto tokens = Tokens(20);
  EXPECT_EQ(*engine_->Prefill(tokens, *kv), *model_->Prefill(tokens, *cache));
  EXPECT_EQ(*engine_->Decode(7, *kv), *model_->Decode(7, *cache));
  EXPECT_EQ(kv->n_tokens(), 21);
  EXPECT_EQ(kv->capacity(), 64);
  EXPECT_EQ(kv->row_bytes(), engine_->config().kv_width() * 4);
  EXPECT_EQ(engine_->kv_bytes_per_token(), engine_->config().n_layers * 2 * kv->row_bytes());
}

TEST_F(EngineTest, RowsGoInAndOutPerLayerConvertingDtypes) {
  const ModelConfig& c = engine_->config();
  auto f32 = *engine_->NewStore(32);
  ASSERT_TRUE(engine_->Prefill(Tokens(10), *f32).ok());
  // Rows read from an f32 store, written as f32 into an f16 store, read back as f16.
  auto f16 = *engine16_->NewStore(32);
  ASSERT_TRUE(f16->SetTokens(10).ok());
  std::vector<uint8_t> rows(10 * f32->row_bytes());
  for (int32_t l = 0; l < c.n_layers; ++l) {
    for (bool values : {false, true}) {
      ASSERT_TRUE(f32->ReadRows(l, values, 0, 10, rows.data()).ok());
      ASSERT_TRUE(f16->WriteRows(l, values, 0, 10, DType::kF32, rows.data()).ok());
    }
    ASSERT_TRUE(f16->FinishLayer(l).ok());
  }
  std::vector<uint8_t> half(10 * f16->row_bytes());
  ASSERT_TRUE(f16->ReadRows(3, true, 0, 10, half.data()).ok());
  ASSERT_TRUE(f32->ReadRows(3, true, 0, 10, rows.data()).ok());
  std::vector<uint16_t> h(10 * c.kv_width());
  std::memcpy(h.data(), half.data(), half.size());
  std::vector<float> back(h.size()), exact(h.size());
  F16ToF32Row(h.data(), back.data(), static_cast<int64_t>(h.size()));
  std::memcpy(exact.data(), rows.data(), rows.size());
  for (size_t i = 0; i < exact.size(); ++i) {
    ASSERT_NEAR(back[i], exact[i], 1e-3f * std::max(1.0f, std::abs(exact[i]))) << i;
  }
  // And f16 rows written into the f32 store come back as the f16 values, widened.
  ASSERT_TRUE(f32->WriteRows(3, true, 0, 10, DType::kF16, half.data()).ok());
  ASSERT_TRUE(f32->ReadRows(3, true, 0, 10, rows.data()).ok());
  std::memcpy(exact.data(), rows.data(), rows.size());
  EXPECT_EQ(exact, back);
  // Ranges and layers outside the store are refused.
  EXPECT_EQ(f32->WriteRows(c.n_layers, false, 0, 1, DType::kF32, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f32->ReadRows(0, false, 30, 5, rows.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f32->WriteRows(0, false, 0, 1, DType::kQ8_0, rows.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(f32->PrepareRead(10).ok());
  EXPECT_EQ(f32->PrepareRead(33).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, ACopyIsIndependentAndScoringLeavesNoTrace) {
  auto kv = *engine16_->NewStore(64);
  EXPECT_EQ(kv->dtype(), DType::kF16);
  auto logits = *engine16_->Prefill(Tokens(16), *kv);
  auto copy = *engine16_->CopyStore(*kv);
  EXPECT_EQ(copy->n_tokens(), 16);
  EXPECT_EQ(copy->dtype(), DType::kF16);
  const std::vector<int32_t> continuation = {4, 8, 15, 16, 23, 42};
  auto nll = engine16_->Score(continuation, *copy, logits);
  ASSERT_TRUE(nll.ok()) << nll.status();
  EXPECT_EQ(nll->nll.size(), continuation.size());
  EXPECT_EQ(kv->n_tokens(), 16) << "the original is untouched";
  auto again = *engine16_->CopyStore(*kv);
  EXPECT_EQ(engine16_->Score(continuation, *again, logits)->mean, nll->mean);
  // A continuation past the store's capacity is refused before anything runs.
  auto full = *engine16_->CopyStore(*kv);
  EXPECT_EQ(engine16_->Score(Tokens(49), *full, logits).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(full->n_tokens(), 16);
}

TEST_F(EngineTest, RefusesStoresAndPredictorsOfAnotherEngine) {
  CpuEngine other(*model_, DType::kF32);
  auto foreign = *other.NewStore(16);
  EXPECT_EQ(engine_->Prefill(Tokens(4), *foreign).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->CopyStore(*foreign).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Resume(*foreign, Tokens(4), true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->LoadPredictors(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, ResumeReplaysOrFeedsTheLastToken) {
  const auto tokens = Tokens(24);
  // What the source would have computed: the history's prefill, then the last token's step.
  auto reference = *engine_->NewStore(64);
  ASSERT_TRUE(engine_->Prefill(std::span(tokens).first(23), *reference).ok());
  const auto expected = *engine_->Decode(tokens.back(), *reference);
  // TOKEN_REPLAY: an empty store, the whole history replayed, the last token fed.
  auto replayed = *engine_->NewStore(64);
  auto r = engine_->Resume(*replayed, tokens, /*replay=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->logits, expected);
  EXPECT_GT(r->prefill_seconds, 0);
  EXPECT_EQ(replayed->n_tokens(), 24);
  // FULL_KV: the history's rows already there; only the last token is fed.
  auto moved = *engine_->NewStore(64);
  ASSERT_TRUE(moved->SetTokens(23).ok());
  std::vector<uint8_t> rows(23 * moved->row_bytes());
  for (int32_t l = 0; l < engine_->config().n_layers; ++l) {
    for (bool values : {false, true}) {
      ASSERT_TRUE(reference->ReadRows(l, values, 0, 23, rows.data()).ok());
      ASSERT_TRUE(moved->WriteRows(l, values, 0, 23, DType::kF32, rows.data()).ok());
    }
  }
  r = engine_->Resume(*moved, tokens, /*replay=*/false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prefill_seconds, 0);
  EXPECT_EQ(r->logits, expected);
  EXPECT_EQ(engine_->Resume(*moved, {}, false).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, RebuildsAGroupAsRebuildGroupDoes) {
  auto fp = ModelFingerprint(*model_);
  ASSERT_TRUE(fp.ok());
  auto tiny = testing::MakeTinyPolicy(*model_, *fp);
  std::shared_ptr<const PredictorBank> bank(std::move(tiny.bank));
  auto predictors = engine_->LoadPredictors(bank);
  ASSERT_TRUE(predictors.ok()) << predictors.status();
  EXPECT_EQ(&(*predictors)->bank(), bank.get());
  auto kv = *engine_->NewStore(64);
  ASSERT_TRUE(engine_->Prefill(Tokens(30), *kv).ok());
  auto expect = *static_cast<CpuKvStore&>(*kv).cache().Clone();
  for (const FoldedGroup& g : bank->groups()) {
    auto seconds = engine_->Rebuild(*kv, **predictors, g, 0, 30);
    ASSERT_TRUE(seconds.ok()) << seconds.status();
    EXPECT_GT(*seconds, 0);
    ASSERT_TRUE(RebuildGroup(*expect, g, model_->config(), model_->backend(), 0, 30).ok());
  }
  const KvCache& got = static_cast<CpuKvStore&>(*kv).cache();
  std::vector<float> a(30 * got.width()), b(a.size());
  for (int32_t l = 0; l < got.n_layers(); ++l) {
    ASSERT_TRUE(expect->ReadKeys(l, 0, 30, a.data()).ok());
    ASSERT_TRUE(got.ReadKeys(l, 0, 30, b.data()).ok());
    EXPECT_EQ(a, b) << "layer " << l;
  }
  CpuEngine other(*model_, DType::kF32);
  EXPECT_EQ(other.Rebuild(*kv, **predictors, bank->groups()[0], 0, 30).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EngineTest, CreateEngineChoosesTheBackendAndSaysWhy) {
  std::string note;
  auto cpu = CreateEngine(*model_, {.backend = "cpu"}, &note);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ((*cpu)->backend(), "cpu");
  EXPECT_EQ(note, "cpu");
  auto f32 = CreateEngine(*model_, {.backend = "auto", .kv_dtype = DType::kF32}, &note);
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ((*f32)->backend(), "cpu");
  EXPECT_NE(note.find("--kv-dtype f32"), std::string::npos) << note;
  EXPECT_EQ(CreateEngine(*model_, {.backend = "tpu"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto automatic = CreateEngine(*model_, {.backend = "auto", .kv_dtype = DType::kF16}, &note);
  ASSERT_TRUE(automatic.ok());
  auto cuda = CreateEngine(*model_, {.backend = "cuda", .kv_dtype = DType::kF16});
  EXPECT_EQ(CreateEngine(*model_, {.backend = "cuda", .kv_dtype = DType::kF32}).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (LoadGpuRuntime().ok() && cuda.ok()) {
    EXPECT_EQ((*automatic)->backend(), "cuda") << note;
    EXPECT_EQ((*cuda)->backend(), "cuda");
  } else {
    EXPECT_EQ((*automatic)->backend(), "cpu");
    EXPECT_NE(note.find("cpu ("), std::string::npos) << note;
    EXPECT_FALSE(cuda.ok());
    EXPECT_NE(cuda.status().message().find("--backend cuda"), std::string_view::npos);
  }
}

// The GPU engine against the CPU oracle, where a GPU is usable: a migration-shaped resume.
TEST_F(EngineTest, TheGpuEngineResumesAsTheCpuDoes) {
  auto gpu = CreateEngine(*model_, {.backend = "cuda", .kv_dtype = DType::kF16});
  if (!gpu.ok()) GTEST_SKIP() << gpu.status().message();
  const auto tokens = Tokens(40);
  auto on_cpu = *engine16_->NewStore(64);
  ASSERT_TRUE(engine16_->Prefill(std::span(tokens).first(39), *on_cpu).ok());
  auto after = *engine16_->CopyStore(*on_cpu);
  const auto expected = *engine16_->Decode(tokens.back(), *after);
  auto on_gpu = *(*gpu)->NewStore(64);
  ASSERT_TRUE(on_gpu->SetTokens(39).ok());
  std::vector<uint8_t> rows(39 * on_cpu->row_bytes());
  for (int32_t l = 0; l < engine_->config().n_layers; ++l) {
    for (bool values : {false, true}) {
      ASSERT_TRUE(on_cpu->ReadRows(l, values, 0, 39, rows.data()).ok());
      ASSERT_TRUE(on_gpu->WriteRows(l, values, 0, 39, DType::kF16, rows.data()).ok());
    }
    ASSERT_TRUE(on_gpu->FinishLayer(l).ok());
  }
  // Rows read back after PrepareRead (from the host copy) are the rows written.
  ASSERT_TRUE(on_gpu->PrepareRead(39).ok());
  std::vector<uint8_t> back(rows.size());
  for (int32_t l = 0; l < engine_->config().n_layers; ++l) {
    ASSERT_TRUE(on_cpu->ReadRows(l, true, 0, 39, rows.data()).ok());
    ASSERT_TRUE(on_gpu->ReadRows(l, true, 0, 39, back.data()).ok());
    EXPECT_EQ(back, rows) << "layer " << l;
  }
  auto r = (*gpu)->Resume(*on_gpu, tokens, false);
  ASSERT_TRUE(r.ok()) << r.status();
  double num = 0, den = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    num += (r->logits[i] - expected[i]) * (r->logits[i] - expected[i]);
    den += expected[i] * expected[i];
  }
  EXPECT_LT(num / den, 2e-4) << "logits NMSE against the CPU (the GPU model test's tolerance)";
}

}  // namespace
}  // namespace riskkv
