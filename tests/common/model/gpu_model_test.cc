// The GPU engine against the CPU model (the oracle, f32 activations): logits, teacher-forced NLL
// and KV after prefill and decode on the tiny models (Llama with interleaved RoPE, Qwen2 with
// biases and half RoPE, a Q4_1 file) and on SmolLM2; RISK-KV rebuilds on the GPU against
// RebuildGroup on the CPU, and a migration-shaped recovery (retained layers uploaded, groups
// rebuilt as their anchors land, the last token decoded); batched steps of several sessions
// against each session run alone. Label gpu: skips, naming the reason, where no GPU is usable.
#include "common/model/gpu_model.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>

#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/recovery/gpu_rebuild.h"
#include "common/recovery/rebuild.h"
#include "tests/kernels/op_reference.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

using testing::Nmse;

// Tolerances, GPU against the f32 CPU oracle. Weights and activations meet as f16 on the GPU, so
// logits drift by about 1e-3 relative; the NLL by a few thousandths of a nat.
constexpr double kLogitsNmse = 2e-4;
constexpr double kNllAbs = 0.01;
constexpr double kKvNmse = 2e-4;
// A rebuild reads exact f16 KV and writes f16 on both sides; only f32 summation order differs.
constexpr double kRebuildNmse = 1e-6;

std::unique_ptr<Model> LoadCpu(const std::filesystem::path& path) {
  auto m = Model::Load(path.string(), {.threads = 0, .activations = ActivationPrecision::kF32});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Tokens(int64_t n, int64_t vocab, int32_t salt) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 131 + salt * 17 + 5) % vocab);
  return t;
}

// Keys or values of `layer`, rows [0, n), as f32.
std::vector<float> Rows(const KvCache& c, int64_t layer, bool values, int64_t n) {
  std::vector<float> out(n * c.width());
  auto s = values ? c.ReadValues(layer, 0, n, out.data()) : c.ReadKeys(layer, 0, n, out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(GpuModelAvailability, AbsentGpuIsUnavailableWithAReason) {
  auto cpu = LoadCpu(testing::TestdataDir() / "tiny_llama.gguf");
  ASSERT_NE(cpu, nullptr);
  auto gpu = GpuModel::Create(*cpu);
  if (gpu.ok()) {
    EXPECT_GT((*gpu)->device_bytes(), 0);
  } else {
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable) << gpu.status();
    EXPECT_FALSE(gpu.status().message().empty());
  }
}

// The host half of the upload runs everywhere: every slot the engine needs, once, with the
// engine's shape, and matrices equal to the stored weights up to f16 rounding.
TEST(GpuWeights, EverySlotOnceWithTheEnginesShapes) {
  for (const char* file :
       {"tiny_llama.gguf", "tiny_llama_q4_1.gguf", "tiny_qwen2.gguf", "tiny_qwen2_untied.gguf",
        "tiny_llama_kquant.gguf", "tiny_phi3.gguf", "tiny_llama_llama3.gguf"}) {
    SCOPED_TRACE(file);
    auto model = LoadCpu(testing::TestdataDir() / file);
    ASSERT_NE(model, nullptr);
    const ModelConfig& c = model->config();
    const int64_t q = c.n_heads * c.head_dim, kv = c.kv_width();
    std::map<std::pair<int32_t, int>, std::pair<int64_t, int64_t>> want = {
        {{-1, cuda::kTokenEmbedding}, {c.vocab, c.hidden}},
        {{-1, cuda::kOutputNorm}, {c.hidden, 0}}};
    if (!c.tied_embeddings) want[{-1, cuda::kLmHead}] = {c.vocab, c.hidden};
    for (int32_t l = 0; l < c.n_layers; ++l) {
      want[{l, cuda::kWq}] = {q, c.hidden};
      want[{l, cuda::kWk}] = {kv, c.hidden};
      want[{l, cuda::kWv}] = {kv, c.hidden};
      want[{l, cuda::kWo}] = {c.hidden, q};
      want[{l, cuda::kWGate}] = {c.ffn, c.hidden};
      want[{l, cuda::kWUp}] = {c.ffn, c.hidden};
      want[{l, cuda::kWDown}] = {c.hidden, c.ffn};
      want[{l, cuda::kAttnNorm}] = {c.hidden, 0};
      want[{l, cuda::kFfnNorm}] = {c.hidden, 0};
      if (c.qkv_bias) {
        want[{l, cuda::kBq}] = {q, 0};
        want[{l, cuda::kBk}] = {kv, 0};
        want[{l, cuda::kBv}] = {kv, 0};
      }
    }
    std::map<std::pair<int32_t, int>, std::pair<int64_t, int64_t>> got;
    double worst = 0.0;
    auto status = ForEachGpuWeight(*model, [&](const GpuWeight& w) {
      EXPECT_TRUE(got.emplace(std::pair{w.layer, w.slot}, std::pair{w.rows, w.cols}).second)
          << w.name << " twice";
      EXPECT_EQ(w.cols == 0 ? w.f32.size() : w.f16.size(),
                static_cast<size_t>(w.rows * std::max<int64_t>(w.cols, 1)))
          << w.name;
      if (w.slot == cuda::kWk) {  // against the stored projection, dequantized here
        const WeightMatrix m = model->kv_projection(w.layer).k;
        std::vector<float> row(m.cols);
        for (int64_t r = 0; r < m.rows; ++r) {
          DequantizeRow(m.dtype, m.row(r), row.data(), m.cols);
          for (int64_t j = 0; j < m.cols; ++j) {
            const float h = F16ToF32(w.f16[r * m.cols + j]);
            worst = std::max(worst, std::fabs(h - row[j]) / (std::fabs(row[j]) + 1e-4));
          }
        }
      }
      return absl::OkStatus();
    });
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(got, want);
    EXPECT_LT(worst, 1e-3) << "f16 conversion of the K projections";
  }
}

TEST(GpuWeights, TheFirstErrorStopsTheWalk) {
  auto model = LoadCpu(testing::TestdataDir() / "tiny_llama.gguf");
  ASSERT_NE(model, nullptr);
  int calls = 0;
  auto status = ForEachGpuWeight(*model, [&](const GpuWeight&) {
    return ++calls == 3 ? absl::InternalError("stop") : absl::OkStatus();
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 3);
}

// The stacking the engine's single GEMM per group relies on, for f32 and f16 banks.
TEST(GpuPredictorStacking, TargetsKThenVInGroupOrder) {
  auto model = LoadCpu(testing::TestdataDir() / "tiny_llama_deep.gguf");
  ASSERT_NE(model, nullptr);
  auto fp = ModelFingerprint(*model);
  ASSERT_TRUE(fp.ok());
  const int64_t w = model->config().kv_width();
  for (DType dtype : {DType::kF32, DType::kF16}) {
    auto tiny = testing::MakeTinyPolicy(*model, *fp, 3, dtype);
    for (const FoldedGroup& g : tiny.bank->groups()) {
      std::vector<float> a, c;
      ASSERT_TRUE(StackGroupMaps(g, w, &a, &c).ok());
      const int64_t f = g.maps.front().k.cols;
      ASSERT_EQ(a.size(), 2 * g.maps.size() * w * f);
      std::vector<float> row(f);
      for (size_t t = 0; t < g.maps.size(); ++t) {
        for (int64_t r = 0; r < w; r += 7) {
          DequantizeRow(g.maps[t].k.dtype, g.maps[t].k.row(r), row.data(), f);
          EXPECT_TRUE(std::equal(row.begin(), row.end(), a.begin() + ((2 * t) * w + r) * f));
          DequantizeRow(g.maps[t].v.dtype, g.maps[t].v.row(r), row.data(), f);
          EXPECT_TRUE(std::equal(row.begin(), row.end(), a.begin() + ((2 * t + 1) * w + r) * f));
        }
        EXPECT_TRUE(std::equal(g.maps[t].c_k.begin(), g.maps[t].c_k.end(), c.begin() + 2 * t * w));
        EXPECT_TRUE(
            std::equal(g.maps[t].c_v.begin(), g.maps[t].c_v.end(), c.begin() + (2 * t + 1) * w));
      }
      FoldedGroup short_one = g;
      short_one.maps.pop_back();
      EXPECT_EQ(StackGroupMaps(short_one, w, &a, &c).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(StackGroupMaps(g, w + 1, &a, &c).code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

class GpuModelMatchesCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuModelMatchesCpu, LogitsNllAndKv) {
  if (auto runtime = LoadGpuRuntime(); !runtime.ok()) GTEST_SKIP() << runtime.status().message();
  std::filesystem::path path =
      GetParam() == "smollm2" ? testing::DefaultModelPath() : testing::TestdataDir() / GetParam();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " is absent";
  auto cpu = LoadCpu(path);
  ASSERT_NE(cpu, nullptr);
  auto gpu = GpuModel::Create(*cpu);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int64_t vocab = cpu->config().vocab;
  // A history that fills the tiny models' context and, on SmolLM2, crosses the GPU's 1,024-token
  // micro-batch (and the CPU's 256); then three decode steps and a 40-token continuation.
  const int64_t room = 3 + 40 + 1;
  const auto history =
      Tokens(std::min<int64_t>(1100, cpu->config().context_length - room), vocab, 1);
  const auto more = Tokens(3, vocab, 2);
  const int64_t capacity = static_cast<int64_t>(history.size()) + room;
  auto cache = cpu->NewKvCache(capacity, DType::kF16);
  ASSERT_TRUE(cache.ok());
  auto session = (*gpu)->NewSession(capacity);
  ASSERT_TRUE(session.ok()) << session.status();
  auto ref = cpu->Prefill(history, **cache);
  auto got = (*gpu)->Prefill(history, **session);
  ASSERT_TRUE(ref.ok() && got.ok()) << got.status();
  EXPECT_LT(Nmse(got->data(), ref->data(), vocab), kLogitsNmse) << "prefill";
  for (int32_t t : more) {
    ref = cpu->Decode(t, **cache);
    got = (*gpu)->Decode(t, **session);
    ASSERT_TRUE(ref.ok() && got.ok()) << got.status();
    EXPECT_LT(Nmse(got->data(), ref->data(), vocab), kLogitsNmse) << "decode";
  }
  EXPECT_EQ((*session)->n_tokens(), (*cache)->n_tokens());
  auto downloaded = cpu->NewKvCache(capacity, DType::kF16);
  ASSERT_TRUE((*session)->DownloadTo(**downloaded).ok());
  const int64_t n = (*cache)->n_tokens();
  for (int64_t l = 0; l < cpu->config().n_layers; ++l) {
    for (bool values : {false, true}) {
      const auto a = Rows(**downloaded, l, values, n), b = Rows(**cache, l, values, n);
      EXPECT_LT(Nmse(a.data(), b.data(), static_cast<int64_t>(a.size())), kKvNmse)
          << "layer " << l << (values ? " V" : " K");
    }
  }
  const auto continuation = Tokens(40, vocab, 3);
  auto nll_ref = cpu->TeacherForcedNll(continuation, **cache, *ref);
  auto nll_got = (*gpu)->TeacherForcedNll(continuation, **session, *got);
  ASSERT_TRUE(nll_ref.ok() && nll_got.ok()) << nll_got.status();
  ASSERT_EQ(nll_got->nll.size(), nll_ref->nll.size());
  EXPECT_NEAR(nll_got->mean, nll_ref->mean, kNllAbs);
  // A token outside the vocabulary is refused as on the CPU, and the session survives it.
  const int32_t bad = static_cast<int32_t>(vocab);
  EXPECT_EQ((*gpu)->Decode(bad, **session).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*gpu)->Decode(1, **session).ok());
}

INSTANTIATE_TEST_SUITE_P(Models, GpuModelMatchesCpu,
                         ::testing::Values("tiny_llama.gguf", "tiny_llama_q4_1.gguf",
                                           "tiny_qwen2.gguf", "tiny_llama_llama3.gguf",
                                           "tiny_qwen2_yarn.gguf", "tiny_llama_kquant.gguf",
                                           "tiny_phi3.gguf", "tiny_qwen2_untied.gguf",
                                           "tiny_llama_linear.gguf", "smollm2"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

// Batched steps (GpuModel::ForwardMany): each session of a mixed batch (decodes, prefill chunks
// with and without logits, all-logits scoring, more rows than one 1,024-row micro-batch) against
// the same session run alone on the GPU and against the CPU oracle within the tolerances above.
// Bit for bit as alone is the Engine::Step contract, but cuBLAS chooses its kernels by shape and
// a batch's GEMMs have more rows than a session's alone, so it is its own test case; the
// other checks the batching itself (positions, caches, logit rows), where a mistake costs far
// more than kBatchNmse.
constexpr double kBatchNmse = 1e-5;
struct BatchSpec {
  int64_t history = 0;  // tokens already in the session
  int64_t n = 0;        // tokens in the step
  bool all_logits = false;
  bool logits = true;
};

// One session three ways: run in batches, run alone on the GPU, and on the CPU.
struct Twins {
  std::unique_ptr<GpuSession> batched, alone;
  std::unique_ptr<KvCache> cpu;
};

// `got` (batched) against `want` (alone): bit for bit, or within kBatchNmse; a bitwise
// difference names the first element and the NMSE, to tell kernel choice from a batching error.
void ExpectAsAlone(const std::vector<float>& got, const std::vector<float>& want, bool bitwise,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (got.empty()) return;
  const double e = Nmse(got.data(), want.data(), static_cast<int64_t>(got.size()));
  if (!bitwise) {
    EXPECT_LT(e, kBatchNmse) << what << " against the session run alone";
    return;
  }
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0) return;
  size_t i = 0;
  while (std::memcmp(&got[i], &want[i], sizeof(float)) == 0) ++i;
  ADD_FAILURE() << what << ": differs from the session run alone at " << i << " (" << got[i]
                << " vs " << want[i] << "), NMSE " << e;
}

class GpuBatchStep : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (auto runtime = LoadGpuRuntime(); !runtime.ok()) GTEST_SKIP() << runtime.status().message();
    cpu_ = LoadCpu(testing::TestdataDir() / GetParam());
    ASSERT_NE(cpu_, nullptr);
    auto gpu = GpuModel::Create(*cpu_);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    capacity_ = cpu_->config().context_length;
  }

  // A session holding `history` tokens, three ways.
  void Start(int64_t history, int32_t salt, Twins* t) {
    auto a = gpu_->NewSession(capacity_), b = gpu_->NewSession(capacity_);
    auto c = cpu_->NewKvCache(capacity_, DType::kF16);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    t->batched = std::move(*a), t->alone = std::move(*b), t->cpu = std::move(*c);
    if (history == 0) return;
    const auto tokens = Tokens(history, cpu_->config().vocab, salt);
    ASSERT_TRUE(gpu_->Prefill(tokens, *t->batched).ok());
    ASSERT_TRUE(gpu_->Prefill(tokens, *t->alone).ok());
    ASSERT_TRUE(cpu_->Prefill(tokens, *t->cpu).ok());
  }

  // Runs `tokens` on the alone and CPU twins and checks the batched twin's logits `got` and every
  // KV row against them.
  void Compare(Twins& t, std::span<const int32_t> tokens, const BatchSpec& spec,
               const std::vector<float>& got, bool bitwise) {
    std::vector<float> alone, ref;
    ASSERT_TRUE(
        gpu_->Forward(tokens, *t.alone, spec.all_logits, spec.logits ? &alone : nullptr).ok());
    ForwardOptions options;
    options.all_logits = spec.all_logits;
    ASSERT_TRUE(cpu_->Forward(tokens, *t.cpu, options, spec.logits ? &ref : nullptr).ok());
    ExpectAsAlone(got, alone, bitwise, "logits");
    if (spec.logits) {
      EXPECT_LT(Nmse(got.data(), ref.data(), static_cast<int64_t>(ref.size())), kLogitsNmse);
    }
    const int64_t n = t.cpu->n_tokens();
    ASSERT_EQ(t.batched->n_tokens(), n);
    auto batched = cpu_->NewKvCache(capacity_, DType::kF16);
    auto alone_kv = cpu_->NewKvCache(capacity_, DType::kF16);
    ASSERT_TRUE(batched.ok() && alone_kv.ok());
    ASSERT_TRUE(t.batched->DownloadTo(**batched).ok());
    ASSERT_TRUE(t.alone->DownloadTo(**alone_kv).ok());
    for (int32_t l = 0; l < cpu_->config().n_layers; ++l) {
      for (bool values : {false, true}) {
        const std::string what = "layer " + std::to_string(l) + (values ? " V" : " K");
        const auto x = Rows(**batched, l, values, n);
        ExpectAsAlone(x, Rows(**alone_kv, l, values, n), bitwise, what);
        const auto y = Rows(*t.cpu, l, values, n);
        EXPECT_LT(Nmse(x.data(), y.data(), static_cast<int64_t>(x.size())), kKvNmse) << what;
      }
    }
  }

  // A mixed step of several sessions, then a decode step of each, every session checked.
  void RunMixedSteps(bool bitwise);

  std::unique_ptr<Model> cpu_;
  std::unique_ptr<GpuModel> gpu_;
  int64_t capacity_ = 0;
};

void GpuBatchStep::RunMixedSteps(bool bitwise) {
  const std::vector<BatchSpec> specs = {
      {.history = 30, .n = 1},                       // decode
      {.history = 100, .n = 1},                      // decode
      {.history = 20, .n = 50},                      // prefill chunk
      {.history = 0, .n = 60, .logits = false},      // prefill, no logits
      {.history = 40, .n = 25, .all_logits = true},  // scoring
      {.history = 0, .n = 230, .all_logits = true},  // these four take the step past
      {.history = 10, .n = 230},                     // one 1,024-row micro-batch
      {.history = 0, .n = 230, .all_logits = true},
      {.history = 5, .n = 230, .logits = false}};
  const int64_t vocab = cpu_->config().vocab;
  std::vector<Twins> twins(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    Start(specs[i].history, static_cast<int32_t>(i), &twins[i]);
    if (HasFatalFailure()) return;
  }
  // The mixed step, then a decode step of every session.
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step == 0 ? "mixed step" : "decode step");
    std::vector<std::vector<int32_t>> tokens(specs.size());
    std::vector<std::vector<float>> logits(specs.size());
    std::vector<BatchSpec> spec = specs;
    std::vector<GpuSegment> segments;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (step == 1) spec[i] = {.n = 1, .logits = true};
      tokens[i] = Tokens(spec[i].n, vocab, static_cast<int32_t>(100 * step + i));
      segments.push_back({.tokens = tokens[i],
                          .session = twins[i].batched.get(),
                          .all_logits = spec[i].all_logits,
                          .logits = spec[i].logits ? &logits[i] : nullptr});
    }
    const std::vector<absl::Status> status = gpu_->ForwardMany(segments);
    ASSERT_EQ(status.size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "session " << i);
      ASSERT_TRUE(status[i].ok()) << status[i];
      Compare(twins[i], tokens[i], spec[i], logits[i], bitwise);
    }
  }
}

TEST_P(GpuBatchStep, EachSessionCloseToAloneAndToTheCpu) { RunMixedSteps(/*bitwise=*/false); }

TEST_P(GpuBatchStep, EachSessionBitForBitAsAlone) { RunMixedSteps(/*bitwise=*/true); }

TEST_P(GpuBatchStep, ABadSegmentFailsAloneAndLeavesItsSession) {
  const int64_t vocab = cpu_->config().vocab;
  Twins good, other, full, idle;
  Start(10, 1, &good);
  Start(12, 2, &other);
  Start(capacity_ - 2, 3, &full);
  Start(7, 4, &idle);
  if (HasFatalFailure()) return;
  auto stranger_model = GpuModel::Create(*cpu_);
  ASSERT_TRUE(stranger_model.ok());
  auto stranger = (*stranger_model)->NewSession(capacity_);
  ASSERT_TRUE(stranger.ok());
  const std::vector<int32_t> one = {3}, two = {4, 5}, bad = {1, static_cast<int32_t>(vocab)},
                             three = {6, 7, 8};
  std::vector<float> l0, l1, l2, l3, l4, l5, l6, l7;
  const std::vector<GpuSegment> segments = {
      {.tokens = one, .session = good.batched.get(), .logits = &l0},
      {.tokens = bad, .session = idle.batched.get(), .logits = &l1},    // id outside the vocab
      {.tokens = two, .session = good.batched.get(), .logits = &l2},    // the same session
      {.tokens = three, .session = full.batched.get(), .logits = &l3},  // past the capacity
      {.tokens = {}, .session = idle.batched.get(), .logits = &l4},     // no tokens
      {.tokens = one, .session = nullptr, .logits = &l5},               // no session
      {.tokens = one, .session = stranger->get(), .logits = &l6},       // another model's
      {.tokens = two, .session = other.batched.get(), .logits = &l7}};
  const std::vector<absl::Status> status = gpu_->ForwardMany(segments);
  ASSERT_EQ(status.size(), segments.size());
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kInvalidArgument) << status[1];
  EXPECT_EQ(status[2].code(), absl::StatusCode::kInvalidArgument) << status[2];
  EXPECT_EQ(status[3].code(), absl::StatusCode::kOutOfRange) << status[3];
  EXPECT_EQ(status[4].code(), absl::StatusCode::kInvalidArgument) << status[4];
  EXPECT_EQ(status[5].code(), absl::StatusCode::kInvalidArgument) << status[5];
  EXPECT_EQ(status[6].code(), absl::StatusCode::kInvalidArgument) << status[6];
  EXPECT_TRUE(status[7].ok()) << status[7];
  EXPECT_EQ(idle.batched->n_tokens(), 7);
  EXPECT_EQ(full.batched->n_tokens(), capacity_ - 2);
  EXPECT_EQ((*stranger)->n_tokens(), 0);
  Compare(good, one, {.n = 1}, l0, /*bitwise=*/false);
  Compare(other, two, {.n = 2}, l7, /*bitwise=*/false);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuBatchStep,
                         ::testing::Values("tiny_llama.gguf", "tiny_qwen2.gguf"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

class GpuRebuild : public ::testing::Test {
 protected:
  void SetUp() override {
    cpu_ = LoadCpu(testing::TestdataDir() / "tiny_llama_deep.gguf");
    ASSERT_NE(cpu_, nullptr);
    auto gpu = GpuModel::Create(*cpu_);
    if (!gpu.ok() && gpu.status().code() == absl::StatusCode::kUnavailable) {
      GTEST_SKIP() << gpu.status().message();
    }
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    auto fp = ModelFingerprint(*cpu_);
    ASSERT_TRUE(fp.ok());
    tiny_ = testing::MakeTinyPolicy(*cpu_, *fp, 3, DType::kF16);
    auto preds = GpuPredictors::Create(*gpu_, *tiny_.bank);
    ASSERT_TRUE(preds.ok()) << preds.status();
    preds_ = std::move(*preds);
  }
  std::unique_ptr<Model> cpu_;
  std::unique_ptr<GpuModel> gpu_;
  testing::TinyPolicy tiny_;
  std::unique_ptr<GpuPredictors> preds_;
};

TEST_F(GpuRebuild, GroupsMatchTheCpuRebuild) {
  const int64_t n = 200;
  auto exact = cpu_->NewKvCache(256, DType::kF16);
  ASSERT_TRUE(cpu_->Prefill(Tokens(n, cpu_->config().vocab, 4), **exact).ok());
  auto rebuilt = (*exact)->Clone();
  ASSERT_TRUE(rebuilt.ok());
  for (const FoldedGroup& g : tiny_.bank->groups()) {
    ASSERT_TRUE(RebuildGroup(**rebuilt, g, cpu_->config(), cpu_->backend(), 0, n).ok());
  }
  auto session = gpu_->NewSession(256);
  ASSERT_TRUE(session.ok());
  std::vector<int32_t> all(cpu_->config().n_layers);
  for (size_t l = 0; l < all.size(); ++l) all[l] = static_cast<int32_t>(l);
  ASSERT_TRUE((*session)->UploadFrom(**exact, all).ok());
  ASSERT_TRUE((*session)->SetTokens(n).ok());
  for (const FoldedGroup& g : tiny_.bank->groups()) {
    ASSERT_TRUE(preds_->Rebuild(**session, g, 0, n).ok());
  }
  auto back = cpu_->NewKvCache(256, DType::kF16);
  ASSERT_TRUE((*session)->DownloadTo(**back).ok());
  for (int64_t l = 0; l < cpu_->config().n_layers; ++l) {
    const bool target = tiny_.bank->FindGroupForLayer(static_cast<int32_t>(l)) != nullptr;
    for (bool values : {false, true}) {
      const auto a = Rows(**back, l, values, n), b = Rows(**rebuilt, l, values, n);
      const double e = Nmse(a.data(), b.data(), static_cast<int64_t>(a.size()));
      if (target) {
        EXPECT_LT(e, kRebuildNmse) << "rebuilt layer " << l << (values ? " V" : " K");
      } else {
        EXPECT_EQ(e, 0.0) << "exact layer " << l << " changed";
      }
    }
  }
  // A group that is not one of the bank's own (here a copy of one) is refused.
  FoldedGroup stranger = tiny_.bank->groups().front();
  EXPECT_EQ(preds_->Rebuild(**session, stranger, 0, n).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(GpuRebuild, RecoveryFromRetainedLayersMatchesTheCpuPath) {
  const auto tokens = Tokens(129, cpu_->config().vocab, 5);
  const int64_t history = 128;
  auto source = cpu_->NewKvCache(256, DType::kF16);
  ASSERT_TRUE(cpu_->Prefill(std::span(tokens).first(history), **source).ok());
  // The CPU target: retained layers copied, groups rebuilt, the last token decoded.
  auto cpu_target = (*source)->Clone();
  ASSERT_TRUE(cpu_target.ok());
  for (const FoldedGroup& g : tiny_.bank->groups()) {
    ASSERT_TRUE(RebuildGroup(**cpu_target, g, cpu_->config(), cpu_->backend(), 0, history).ok());
  }
  auto ref = cpu_->Decode(tokens.back(), **cpu_target);
  ASSERT_TRUE(ref.ok());
  // The GPU target: only kept layers cross (anchors first, as SendOrder does), each group rebuilt
  // once its anchors are marked, then the decode step.
  auto session = gpu_->NewSession(256);
  ASSERT_TRUE(session.ok());
  ASSERT_TRUE((*session)->SetTokens(history).ok());
  for (const FoldedGroup& g : tiny_.bank->groups()) {
    ASSERT_TRUE((*session)->UploadFrom(**source, g.group.anchors).ok());
    ASSERT_TRUE(preds_->Rebuild(**session, g, 0, history).ok());
  }
  std::vector<int32_t> rest;
  for (int32_t l : tiny_.policy.kept_layers) rest.push_back(l);
  ASSERT_TRUE((*session)->UploadFrom(**source, rest).ok());
  auto got = gpu_->Decode(tokens.back(), **session);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(Nmse(got->data(), ref->data(), cpu_->config().vocab), kLogitsNmse);
}

}  // namespace
}  // namespace riskkv
