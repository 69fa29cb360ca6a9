// RoPE scaling parameters: the divisors and factors each formula gives at its edges, and every
// out-of-domain parameter refused by name. The rotations themselves are checked against the
// NumPy reference by model_golden_test (tiny_*_llama3, _linear, _yarn).
#include "common/model/rope_scaling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <utility>

#include "common/model/gpu_model.h"
#include "common/model/model_config.h"

namespace riskkv {
namespace {

using ::testing::HasSubstr;

TEST(RopeScalingTest, NoneIsUnscaled) {
  auto s = ComputeRopeScaling({}, 10000.0, 64);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->freq_divisors.empty());
  EXPECT_EQ(s->attn_factor, 1.0);
}

TEST(RopeScalingTest, LinearDividesEveryFrequency) {
  auto s = ComputeRopeScaling({.type = "linear", .factor = 2.5}, 10000.0, 16);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->freq_divisors, std::vector<double>(8, 2.5));
  EXPECT_EQ(s->attn_factor, 1.0);
}

TEST(RopeScalingTest, Llama3KeepsHighFrequenciesAndScalesLowOnes) {
  // Llama 3.1's own parameters over a 128-wide head with base 500000.
  auto s = ComputeRopeScaling({.type = "llama3",
                               .factor = 8,
                               .original_context = 8192,
                               .low_freq_factor = 1,
                               .high_freq_factor = 4},
                              500000.0, 128);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->freq_divisors.size(), 64u);
  EXPECT_EQ(s->freq_divisors.front(), 1.0);  // wavelength 2 pi < 8192 / 4
  EXPECT_EQ(s->freq_divisors.back(), 8.0);   // wavelength far beyond 8192
  bool blended = false;
  for (size_t i = 1; i < s->freq_divisors.size(); ++i) {
    EXPECT_GE(s->freq_divisors[i], s->freq_divisors[i - 1]);  // monotone in wavelength
    blended |= s->freq_divisors[i] > 1.0 && s->freq_divisors[i] < 8.0;
  }
  EXPECT_TRUE(blended);
}

TEST(RopeScalingTest, YarnRampsAndScalesMagnitude) {
  auto s =
      ComputeRopeScaling({.type = "yarn", .factor = 4, .original_context = 32768}, 1000000.0, 64);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->freq_divisors.front(), 1.0);
  EXPECT_EQ(s->freq_divisors.back(), 4.0);
  EXPECT_DOUBLE_EQ(s->attn_factor, 0.1 * std::log(4.0) + 1.0);
  auto given = ComputeRopeScaling(
      {.type = "yarn", .factor = 4, .original_context = 32768, .attention_factor = 1.25}, 1000000.0,
      64);
  ASSERT_TRUE(given.ok());
  EXPECT_EQ(given->attn_factor, 1.25);
}

void ExpectRefused(const RopeScalingSpec& spec, const std::string& fragment) {
  auto s = ComputeRopeScaling(spec, 10000.0, 64);
  ASSERT_FALSE(s.ok()) << spec.type << " accepted";
  EXPECT_THAT(s.status().message(), HasSubstr(fragment));
}

TEST(RopeScalingTest, ParametersOutsideTheirDomainAreRefused) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ExpectRefused({.type = "dynamic", .factor = 2}, "'dynamic' is not supported");
  ExpectRefused({.type = "longrope", .factor = 2}, "'longrope' is not supported");
  ExpectRefused({.type = "linear", .factor = 0.5}, "factor 0.5 must be a finite number >= 1");
  ExpectRefused({.type = "linear", .factor = nan}, "must be a finite number");
  ExpectRefused({.type = "llama3", .factor = 8, .original_context = 0},
                "original context length 0");
  ExpectRefused({.type = "llama3",
                 .factor = 8,
                 .original_context = 8192,
                 .low_freq_factor = 4,
                 .high_freq_factor = 1},
                "must satisfy 0 < low < high");
  ExpectRefused({.type = "yarn", .factor = 4, .original_context = 4096, .beta_fast = -1},
                "beta_fast and beta_slow must be > 0");
  EXPECT_FALSE(RopeScalingFromFactors({1, 2}, 8).ok());
  EXPECT_THAT(RopeScalingFromFactors({1, 2, 0, 4}, 8).status().message(),
              HasSubstr("factor 2 is 0"));
  EXPECT_TRUE(RopeScalingFromFactors({1, 2, 3, 4}, 8).ok());
}

// config.json with `extra` merged into a small valid Llama config, read back.
absl::StatusOr<ModelConfig> HfConfig(const std::string& name, const std::string& extra,
                                     const std::string& model_type = "llama") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("riskkv_rope_" + std::to_string(::getpid()) + "_" + name + ".json");
  std::ofstream(path) << R"({"model_type": ")" << model_type
                      << R"(", "num_hidden_layers": 2, "hidden_size": 64,
      "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 32, "max_position_embeddings": 4096, "rope_theta": 500000.0)"
                      << extra << "}";
  absl::StatusOr<ModelConfig> c = ConfigFromHfJson(path.string());
  std::filesystem::remove(path);
  return c;
}

TEST(RopeScalingTest, HfConfigsDeclareItOrAreRefusedByName) {
  auto llama3 = HfConfig("llama3", R"(, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 512})");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope_scaling.type, "llama3");
  EXPECT_EQ(llama3->rope_scaling.freq_divisors.size(), 8u);
  EXPECT_EQ(llama3->rope().freq_divisors, llama3->rope_scaling.freq_divisors.data());
  auto yarn = HfConfig("yarn", R"(, "rope_scaling": {"type": "yarn", "factor": 4.0})");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_DOUBLE_EQ(yarn->rope().attn_factor, 0.1 * std::log(4.0) + 1.0);
  auto plain = HfConfig("default", R"(, "rope_scaling": {"rope_type": "default"})");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->rope().freq_divisors, nullptr);

  const std::pair<const char*, const char*> refused[] = {
      {R"(, "rope_scaling": {"type": "dynamic", "factor": 2.0})", "'dynamic' is not supported"},
      {R"(, "rope_scaling": {"rope_type": "longrope", "factor": 2.0})", "'longrope'"},
      {R"(, "rope_scaling": [1, 2])", "\"rope_scaling\" must be an object"},
      {R"(, "rope_scaling": {"rope_type": "linear", "factor": "2"})", "rope_scaling.factor"},
      {R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "mscale": 0.7})", "mscale"},
      {R"(, "use_sliding_window": true, "sliding_window": 4096)", "sliding-window attention"},
  };
  int i = 0;
  for (const auto& [extra, fragment] : refused) {
    auto c = HfConfig(std::to_string(i++), extra);
    ASSERT_FALSE(c.ok()) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(fragment)) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(".json: ")) << extra;
  }
  EXPECT_TRUE(
      HfConfig("window_off", R"(, "use_sliding_window": false, "sliding_window": 4096)").ok());
  // Phi-3's window caps the context served, but YaRN's original context stays the full 4,096.
  auto phi3 = HfConfig(
      "phi3_yarn", R"(, "sliding_window": 200, "rope_scaling": {"type": "yarn", "factor": 4.0})",
      "phi3");
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  EXPECT_EQ(phi3->context_length, 200);
  auto full =
      ComputeRopeScaling({.type = "yarn", .factor = 4, .original_context = 4096}, 500000.0, 16);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(phi3->rope_scaling.freq_divisors, full->freq_divisors);
}

TEST(RopeScalingTest, TheGpuEngineGetsTheDivisorsAndFactor) {
  ModelConfig c;
  c.name = "scaled";
  c.n_layers = 1;
  c.hidden = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn = 128;
  c.vocab = 32;
  c.context_length = 64;
  c.rope_dim = 16;
  EXPECT_EQ(GpuDims(c).rope_scaled, 0);
  c.rope_scaling =
      *ComputeRopeScaling({.type = "yarn", .factor = 4, .original_context = 32}, 10000.0, 16);
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  const cuda::ModelDims d = GpuDims(c);
  EXPECT_EQ(d.rope_scaled, 1);
  EXPECT_EQ(d.rope_attn_factor, c.rope_scaling.attn_factor);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(d.rope_divisors[i], c.rope_scaling.freq_divisors[i]) << i;
  EXPECT_EQ(d.rope_divisors[8], 1.0);
}

}  // namespace
}  // namespace riskkv
