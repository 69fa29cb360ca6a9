// Model loading and forward-pass behaviour beyond the goldens: format equivalence, the
// calibration hook, and every kind of bad input returning a Status instead of crashing.
#include "common/model/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>

#include "kernels/cpu/panels.h"
#include "tests/common/base/resident_bytes.h"
#include "tests/common/model/golden.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

namespace fs = std::filesystem;

fs::path Tiny(const std::string& name) { return testing::TestdataDir() / name; }

std::unique_ptr<Model> LoadOrDie(const fs::path& path) {
  auto m = Model::Load(path.string(), {.threads = 2, .activations = ActivationPrecision::kF32});
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<float> AllLogits(Model& model, const std::vector<int32_t>& tokens) {
  auto cache = model.NewKvCache(tokens.size());
  std::vector<float> logits;
  ForwardOptions options;
  options.all_logits = true;
  EXPECT_TRUE(model.Forward(tokens, **cache, options, &logits).ok());
  return logits;
}

TEST(Model, ReadsHyperParameters) {
  auto m = LoadOrDie(testing::DefaultModelPath());
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.hidden, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.ffn, 1536);
  EXPECT_EQ(c.vocab, 49152);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_NEAR(c.rms_eps, 1e-5, 1e-9);
  EXPECT_EQ(c.rope_base, 100000.0);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  // Weights stay in their file types: far below the 540 MB an f32 copy would take.
  EXPECT_LT(m->weight_bytes(), 120'000'000);

  auto q = LoadOrDie(Tiny("tiny_qwen2.gguf"));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->config().arch, Architecture::kQwen2);
  EXPECT_TRUE(q->config().qkv_bias);
  EXPECT_TRUE(q->config().tied_embeddings);
  EXPECT_EQ(q->config().rope_layout, RopeLayout::kHalf);
  EXPECT_LT(q->config().n_kv_heads, q->config().n_heads);
}

TEST(Model, GgufAndSafetensorsFormsAgree) {
  // Same weights; GGUF permutes Q/K rows for interleaved RoPE, HF keeps half rotation.
  for (const auto& [gguf, hf] : {std::pair{"tiny_llama.gguf", "tiny_llama_hf"},
                                 std::pair{"tiny_qwen2.gguf", "tiny_qwen2_hf"}}) {
    auto a = LoadOrDie(Tiny(gguf));
    auto b = LoadOrDie(Tiny(hf));
    ASSERT_TRUE(a && b);
    // convert_hf_to_gguf.py permutes llama's Q/K rows to interleaved pairs; qwen2 keeps NEOX.
    const bool llama = std::string(gguf) == "tiny_llama.gguf";
    EXPECT_EQ(a->config().rope_layout, llama ? RopeLayout::kInterleaved : RopeLayout::kHalf)
        << gguf;
    EXPECT_EQ(b->config().rope_layout, RopeLayout::kHalf) << hf;
    const std::vector<int32_t> tokens = {1, 17, 300, 42, 7, 255, 3, 99, 128, 5};
    const auto la = AllLogits(*a, tokens), lb = AllLogits(*b, tokens);
    ASSERT_EQ(la.size(), lb.size());
    EXPECT_LE(testing::ScaledMaxError(la.data(), lb.data(), la.size()), 1e-5) << gguf;
  }
}

TEST(Model, AttentionInputHookSeesEveryLayerAndPosition) {
  auto m = LoadOrDie(Tiny("tiny_llama.gguf"));
  ASSERT_NE(m, nullptr);
  const int64_t layers = m->config().n_layers;
  std::vector<int64_t> seen(layers, 0);
  ForwardOptions options;
  options.attn_input_hook = [&](int64_t layer, int64_t pos0, int64_t n, const float*) {
    EXPECT_EQ(pos0, seen[layer]);
    seen[layer] += n;
  };
  auto cache = m->NewKvCache(64);
  std::vector<float> logits;
  ASSERT_TRUE(m->Forward(std::vector<int32_t>(20, 5), **cache, options, &logits).ok());
  ASSERT_TRUE(m->Forward(std::vector<int32_t>{9}, **cache, options, &logits).ok());
  for (int64_t l = 0; l < layers; ++l) EXPECT_EQ(seen[l], 21) << "layer " << l;
}

TEST(Model, StartingAtALayerFromItsResidualStreamMatchesTheFullPass) {
  auto m = LoadOrDie(Tiny("tiny_llama_deep.gguf"));
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  ASSERT_GE(c.n_layers, 3);
  std::vector<int32_t> history(40), next(24);
  for (size_t i = 0; i < history.size(); ++i) history[i] = static_cast<int32_t>(i * 7 % 90 + 1);
  for (size_t i = 0; i < next.size(); ++i) next[i] = static_cast<int32_t>(i * 13 % 80 + 2);
  auto full = m->NewKvCache(64);
  ASSERT_TRUE(m->Prefill(history, **full).ok());
  auto partial = (*full)->Clone();
  ASSERT_TRUE(partial.ok());

  // The full pass over `next`, keeping every layer's residual stream.
  std::vector<std::vector<float>> residual(c.n_layers);
  ForwardOptions options;
  options.all_logits = true;
  options.residual_hook = [&](int64_t layer, int64_t pos0, int64_t n, const float* x) {
    EXPECT_EQ(pos0, static_cast<int64_t>(history.size()));
    residual[layer].insert(residual[layer].end(), x, x + n * c.hidden);
  };
  std::vector<float> full_logits;
  ASSERT_TRUE(m->Forward(next, **full, options, &full_logits).ok());

  const int64_t first = 2;
  ForwardOptions from;
  from.all_logits = true;
  from.first_layer = first;
  from.first_hidden = residual[first].data();
  int64_t hooked = 0;
  from.residual_hook = [&](int64_t layer, int64_t, int64_t, const float*) {
    EXPECT_GE(layer, first);
    ++hooked;
  };
  std::vector<float> partial_logits;
  ASSERT_TRUE(m->Forward(next, **partial, from, &partial_logits).ok());
  EXPECT_EQ(hooked, c.n_layers - first);
  EXPECT_EQ(partial_logits, full_logits);  // bit for bit
  EXPECT_EQ((*partial)->n_tokens(), (*full)->n_tokens());
  const int64_t w = (*full)->width(), rows = static_cast<int64_t>(next.size());
  for (int64_t l = first; l < c.n_layers; ++l) {
    std::vector<float> a(rows * w), b(rows * w);
    ASSERT_TRUE((*full)->ReadKeys(l, history.size(), rows, a.data()).ok());
    ASSERT_TRUE((*partial)->ReadKeys(l, history.size(), rows, b.data()).ok());
    EXPECT_EQ(a, b) << "keys of layer " << l;
    ASSERT_TRUE((*full)->ReadValues(l, history.size(), rows, a.data()).ok());
    ASSERT_TRUE((*partial)->ReadValues(l, history.size(), rows, b.data()).ok());
    EXPECT_EQ(a, b) << "values of layer " << l;
  }

  // A start layer needs its hidden state, and only a start layer above 0 takes one.
  ASSERT_TRUE((*partial)->SetTokens(history.size()).ok());
  for (auto [layer, hidden] : std::vector<std::pair<int64_t, const float*>>{
           {first, nullptr}, {0, residual[0].data()}, {-1, nullptr}, {c.n_layers, nullptr}}) {
    ForwardOptions bad;
    bad.first_layer = layer;
    bad.first_hidden = hidden;
    EXPECT_EQ(m->Forward(next, **partial, bad, nullptr).code(), absl::StatusCode::kInvalidArgument)
        << "first_layer " << layer;
  }
  EXPECT_EQ((*partial)->n_tokens(), static_cast<int64_t>(history.size()));
}

// Phi-3: fused matrices split into views of the file's data, and the declared sliding window
// (200, below the tiny context of 256) caps the positions served, in both file forms.
TEST(Model, Phi3SplitsFusedMatricesAndServesWithinItsWindow) {
  for (const char* name : {"tiny_phi3_hf", "tiny_phi3.gguf"}) {
    SCOPED_TRACE(name);
    auto m = LoadOrDie(Tiny(name));
    ASSERT_NE(m, nullptr);
    const ModelConfig& c = m->config();
    EXPECT_EQ(c.arch, Architecture::kPhi3);
    EXPECT_EQ(c.rope_layout, RopeLayout::kHalf);
    EXPECT_EQ(c.context_length, 200);
    const Model::KvProjection proj = m->kv_projection(0);
    EXPECT_EQ(proj.k.rows, c.kv_width());
    EXPECT_EQ(proj.v.rows, c.kv_width());
    // V follows K in the fused matrix.
    EXPECT_EQ(proj.v.row(0), proj.k.row(c.kv_width()));
    auto cache = m->NewKvCache(c.context_length + 8);
    ASSERT_TRUE(cache.ok());
    auto too_long = m->Prefill(std::vector<int32_t>(c.context_length + 1, 3), **cache);
    EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  }
}

TEST(Model, RejectsBadTokensAndOverlongPrompts) {
  auto m = LoadOrDie(Tiny("tiny_llama.gguf"));
  ASSERT_NE(m, nullptr);
  auto cache = m->NewKvCache(m->config().context_length);
  const int32_t vocab = static_cast<int32_t>(m->config().vocab);
  for (int32_t bad : {vocab, -1, 1 << 30}) {
    auto r = m->Prefill(std::vector<int32_t>{1, bad}, **cache);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("index 1"), std::string::npos) << r.status();
  }
  EXPECT_EQ((*cache)->n_tokens(), 0);  // nothing applied
  auto too_long = m->Prefill(std::vector<int32_t>(m->config().context_length + 1, 3), **cache);
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find("context length"), std::string::npos);
  EXPECT_EQ((*cache)->n_tokens(), 0);
  auto small = m->NewKvCache(4);
  EXPECT_EQ(m->Prefill(std::vector<int32_t>(5, 3), **small).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*small)->n_tokens(), 0);
  EXPECT_FALSE(m->Prefill(std::vector<int32_t>{}, **small).ok());
  auto nll = m->TeacherForcedNll(std::vector<int32_t>{1, 2}, **small, std::vector<float>(3));
  EXPECT_EQ(nll.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*small)->n_tokens(), 0);
  // The model still works after all the rejected calls.
  EXPECT_TRUE(m->Prefill(std::vector<int32_t>{1, 2, 3}, **small).ok());
  EXPECT_EQ((*small)->n_tokens(), 3);
}

// Model::Forward splits long inputs into micro-batches of 256 tokens and TeacherForcedNll
// scores one micro-batch at a time: 300 real tokens cross that boundary once. The model and
// the one-call all-position logits are shared by the tests below (SmolLM2 is slow on 2 threads).
class SmolLM2MicroBatch : public ::testing::Test {
 protected:
  static constexpr int64_t kTokens = 300;

  static void SetUpTestSuite() {
    auto m = Model::Load(testing::DefaultModelPath().string(),
                         {.threads = 2, .activations = ActivationPrecision::kF32});
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    // Real text, so attention patterns and logits look like the model's working regime.
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t preamble = text.find("The GNU General Public License is a free");
    ASSERT_NE(preamble, std::string::npos) << "cannot read /usr/share/common-licenses/GPL-3";
    auto ids = model_->tokenizer().Encode(text.substr(preamble, 4000), false, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_GE(static_cast<int64_t>(ids->size()), kTokens);
    ids->resize(kTokens);
    tokens_ = std::move(*ids);
    logits_ = AllLogits(*model_, tokens_);
  }
  static void TearDownTestSuite() { model_.reset(); }

  void SetUp() override {
    ASSERT_NE(model_, nullptr);
    ASSERT_EQ(static_cast<int64_t>(logits_.size()), kTokens * model_->config().vocab);
  }

  std::span<const float> Row(int64_t i) const {
    const int64_t vocab = model_->config().vocab;
    return std::span<const float>(logits_).subspan(i * vocab, vocab);
  }

  static inline std::unique_ptr<Model> model_;
  static inline std::vector<int32_t> tokens_;
  static inline std::vector<float> logits_;  // [kTokens, vocab] from one Forward call
};

TEST_F(SmolLM2MicroBatch, OneLongForwardEqualsThreeShortOnes) {
  const int64_t vocab = model_->config().vocab;
  auto cache = model_->NewKvCache(kTokens);
  ASSERT_TRUE(cache.ok());
  ForwardOptions options;
  options.all_logits = true;
  double worst = 0;
  for (int64_t start = 0; start < kTokens; start += 100) {
    std::vector<float> part;
    const auto chunk = std::span<const int32_t>(tokens_).subspan(start, 100);
    ASSERT_TRUE(model_->Forward(chunk, **cache, options, &part).ok());
    ASSERT_EQ(static_cast<int64_t>(part.size()), 100 * vocab);
    for (int64_t i = 0; i < 100; ++i) {
      const auto ref = Row(start + i);
      const double err = testing::ScaledMaxError(part.data() + i * vocab, ref.data(), vocab);
      EXPECT_LE(err, 1e-4) << "position " << start + i;
      worst = std::max(worst, err);
    }
  }
  EXPECT_EQ((*cache)->n_tokens(), kTokens);
  std::printf("300 tokens in one call vs 3 x 100: worst scaled max error %.2e\n", worst);
}

TEST_F(SmolLM2MicroBatch, TeacherForcedNllScoresAcrossTheBoundary) {
  auto cache = model_->NewKvCache(kTokens);
  ASSERT_TRUE(cache.ok());
  auto nll = model_->TeacherForcedNll(tokens_, **cache);
  ASSERT_TRUE(nll.ok()) << nll.status();
  ASSERT_EQ(static_cast<int64_t>(nll->nll.size()), kTokens - 1);
  double sum = 0, worst = 0;
  for (int64_t i = 0; i + 1 < kTokens; ++i) {
    const double ref = TokenNll(Row(i), tokens_[i + 1]);
    EXPECT_NEAR(nll->nll[i], ref, 1e-4) << "token " << i + 1;
    worst = std::max(worst, std::fabs(nll->nll[i] - ref));
    sum += nll->nll[i];
  }
  EXPECT_NEAR(nll->mean, sum / (kTokens - 1), 1e-9);
  EXPECT_EQ((*cache)->n_tokens(), kTokens);
  std::printf("teacher-forced NLL vs all-position logits: worst abs error %.2e\n", worst);
}

TEST_F(SmolLM2MicroBatch, TeacherForcedNllScoresFirstTokenFromGivenLogits) {
  // The history's last logits; any vocab-sized row will do.
  const auto first = Row(kTokens - 1);
  auto cache = model_->NewKvCache(kTokens);
  ASSERT_TRUE(cache.ok());
  auto nll = model_->TeacherForcedNll(tokens_, **cache, first);
  ASSERT_TRUE(nll.ok()) << nll.status();
  ASSERT_EQ(static_cast<int64_t>(nll->nll.size()), kTokens);
  EXPECT_DOUBLE_EQ(nll->nll[0], TokenNll(first, tokens_[0]));
  for (int64_t i = 0; i + 1 < kTokens; ++i) {
    EXPECT_NEAR(nll->nll[i + 1], TokenNll(Row(i), tokens_[i + 1]), 1e-4) << "token " << i + 1;
  }
}

// Weights regrouped in panels are the copy the products read: the GGUF's pages of them are not
// resident after the load, nor after a pass over every weight (the fingerprint's), while a model
// without panels keeps what it read.
TEST(Model, WeightsInPanelsLeaveTheFilesPagesOutOfTheResidentSet) {
  int64_t file_bytes = 0;
  const void* first = nullptr;
  uint64_t sum = 0;
  auto visit = [&](std::string_view, DType, const void* data, size_t bytes) {
    if (first == nullptr) first = data;  // token_embd, in the file's mapping
    file_bytes += static_cast<int64_t>(bytes);
    // Read every page, as the fingerprint's hash does.
    for (size_t i = 0; i < bytes; i += 512) sum += static_cast<const uint8_t*>(data)[i];
  };
  for (const bool panels : {true, false}) {
    SCOPED_TRACE(panels ? "panels" : "no panels");
    auto m = Model::Load(
        testing::DefaultModelPath().string(),
        {.threads = 2, .activations = ActivationPrecision::kInt8, .cpu_panels = panels});
    ASSERT_TRUE(m.ok()) << m.status();
    file_bytes = 0;
    first = nullptr;
    (*m)->ForEachWeight(visit);  // reads every weight's bytes
    const int64_t resident = testing::ResidentBytesOfMapping(first);
    ASSERT_GT(file_bytes, 90'000'000);
    if (panels) {
      EXPECT_LT(resident, file_bytes / 20) << "of " << file_bytes;
    } else {
      EXPECT_GT(resident, file_bytes / 2) << "of " << file_bytes;
    }
    EXPECT_GT(sum, 0u);
    // The products still run, from the panels.
    auto cache = (*m)->NewKvCache(8);
    EXPECT_TRUE((*m)->Prefill(std::vector<int32_t>{1, 2, 3}, **cache).ok());
  }
}

TEST(Model, BadFilesReturnNamedErrors) {
  struct Case {
    std::string file;
    std::string expected;  // substring of the message
  };
  const std::vector<Case> cases = {
      {"bad_missing_tensor.gguf", "blk.1.ffn_up.weight"},
      {"bad_unknown_arch.gguf", "mamba"},
      {"bad_tensor_type.gguf", "blk.0.attn_q.weight"},
      {"bad_shape.gguf", "blk.0.attn_k.weight"},
      {"bad_config_hf", "num_hidden_layers"},
      // RoPE metadata from GGUF that is not implemented, or contradicts itself.
      {"bad_rope_longrope.gguf", "rope_factors_long.weight (longrope RoPE scaling)"},
      {"bad_rope_attn_factor.gguf", "llama.rope.scaling.attn_factor 0.8"},
      {"bad_rope_type.gguf", "RoPE scaling 'dynamic' is not supported"},
      {"bad_rope_yarn_log.gguf", "qwen2.rope.scaling.yarn_log_multiplier"},
      {"bad_rope_freqs_and_type.gguf", "RoPE scaling 'linear' and rope_freqs.weight both given"},
      {"bad_rope_freqs_f16.gguf", "rope_freqs.weight must be a 1-D F32 tensor, not F16"},
      {"bad_rope_freqs_length.gguf", "rope_freqs.weight: RoPE frequency factors: 7 values for 8"},
  };
  for (const auto& c : cases) {
    auto m = Model::Load(Tiny(c.file).string());
    ASSERT_FALSE(m.ok()) << c.file;
    EXPECT_NE(m.status().message().find(c.expected), std::string::npos)
        << c.file << ": " << m.status();
  }
  EXPECT_EQ(Model::Load("/nonexistent/model.gguf").status().code(), absl::StatusCode::kNotFound);
  const fs::path text = fs::temp_directory_path() / "riskkv_not_a_model.txt";
  std::ofstream(text) << "hello";
  EXPECT_EQ(Model::Load(text.string()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Model, TruncatedFilesNeverLoad) {
  const fs::path src = Tiny("tiny_llama_q4_1.gguf");
  std::ifstream in(src, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);
  const fs::path dst = fs::temp_directory_path() / "riskkv_truncated.gguf";
  int tried = 0;
  for (size_t cut = 0; cut < bytes.size(); cut += 1 + cut / 7) {
    std::ofstream(dst, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(cut));
    auto m = Model::Load(dst.string());
    EXPECT_FALSE(m.ok()) << "loaded a file truncated at " << cut << " of " << bytes.size();
    ++tried;
  }
  EXPECT_GT(tried, 50);
  fs::remove(dst);
}

}  // namespace
}  // namespace riskkv
