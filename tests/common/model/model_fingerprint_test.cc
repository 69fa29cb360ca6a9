// ModelFingerprint and Model::ForEachWeight on the tiny generated models.
#include "common/model/model_fingerprint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "tests/test_paths.h"

namespace riskkv {
namespace {

std::unique_ptr<Model> LoadModel(const std::string& name) {
  auto model = Model::Load((riskkv::testing::TestdataDir() / name).string(), {.threads = 1});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

std::string Fingerprint(const std::string& name) {
  std::unique_ptr<Model> model = LoadModel(name);
  if (model == nullptr) return "";
  auto fp = ModelFingerprint(*model);
  EXPECT_TRUE(fp.ok()) << fp.status();
  return fp.ok() ? *fp : "";
}

TEST(ModelFingerprintTest, StableAcrossLoadsOfTheSameFile) {
  const std::string a = Fingerprint("tiny_llama.gguf");
  const std::string b = Fingerprint("tiny_llama.gguf");
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_EQ(a, b);
}

TEST(ModelFingerprintTest, DiffersBetweenModelsAndForms) {
  const std::set<std::string> fps = {
      Fingerprint("tiny_llama.gguf"),     Fingerprint("tiny_llama_q4_1.gguf"),
      Fingerprint("tiny_llama_f16.gguf"), Fingerprint("tiny_llama_hf"),
      Fingerprint("tiny_qwen2.gguf"),
  };
  EXPECT_EQ(fps.size(), 5u);
  EXPECT_EQ(fps.count(""), 0u);
}

// The same weights under another RoPE compute other keys, so a migration between them must be
// refused: the scaling is part of the fingerprint.
TEST(ModelFingerprintTest, DiffersWithTheRopeScalingOfTheSameWeights) {
  const std::set<std::string> fps = {
      Fingerprint("tiny_llama.gguf"),        Fingerprint("tiny_llama_llama3.gguf"),
      Fingerprint("tiny_llama_linear.gguf"), Fingerprint("tiny_qwen2.gguf"),
      Fingerprint("tiny_qwen2_yarn.gguf"),
  };
  EXPECT_EQ(fps.size(), 5u);
  EXPECT_EQ(fps.count(""), 0u);
}

TEST(ModelFingerprintTest, HuggingFaceDirectoryIsStableToo) {
  EXPECT_EQ(Fingerprint("tiny_llama_hf"), Fingerprint("tiny_llama_hf"));
}

struct Visited {
  std::vector<std::string> names;
  int64_t matrix_bytes = 0;
};

Visited Visit(const Model& model) {
  Visited v;
  model.ForEachWeight([&v](std::string_view name, DType dtype, const void* data, size_t bytes) {
    EXPECT_NE(data, nullptr) << name;
    EXPECT_GT(bytes, 0u) << name;
    v.names.emplace_back(name);
    const bool vector = name.ends_with("norm") || name.ends_with(".bq") || name.ends_with(".bk") ||
                        name.ends_with(".bv");
    if (vector) {
      EXPECT_EQ(dtype, DType::kF32) << name;
    } else {
      v.matrix_bytes += static_cast<int64_t>(bytes);
    }
  });
  return v;
}

TEST(ModelFingerprintTest, ForEachWeightVisitsEveryTensorInAFixedOrder) {
  std::unique_ptr<Model> model = LoadModel("tiny_llama.gguf");
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  const Visited v = Visit(*model);
  const size_t expected = 1 + 9 * c.n_layers + 1 + (c.tied_embeddings ? 0 : 1);
  ASSERT_EQ(v.names.size(), expected);
  EXPECT_EQ(v.names.front(), "token_embd");
  EXPECT_EQ(v.names[1], "blk.0.attn_norm");
  EXPECT_EQ(v.names[2], "blk.0.wq");
  EXPECT_EQ(v.names.back(), c.tied_embeddings ? "output_norm" : "lm_head");
  // The matrices are exactly the weights the model counts.
  EXPECT_EQ(v.matrix_bytes, model->weight_bytes());
  EXPECT_EQ(Visit(*model).names, v.names);
}

TEST(ModelFingerprintTest, ForEachWeightIncludesQwen2Biases) {
  std::unique_ptr<Model> model = LoadModel("tiny_qwen2.gguf");
  ASSERT_NE(model, nullptr);
  const Visited v = Visit(*model);
  EXPECT_EQ(v.names.size(),
            1 + 12 * model->config().n_layers + 1 + (model->config().tied_embeddings ? 0 : 1));
  EXPECT_THAT(v.names, ::testing::Contains("blk.0.bk"));
  EXPECT_EQ(v.matrix_bytes, model->weight_bytes());
}

}  // namespace
}  // namespace riskkv
