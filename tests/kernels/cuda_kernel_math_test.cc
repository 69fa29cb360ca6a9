// The per-element math of the GPU's RoPE, feature-gather, rebuilt-scatter and K/V-store kernels
// (kernels/cuda/kernel_math.cuh, the same functions the kernels call), run on the host over every
// element and checked against the CPU oracle: Backend::Rope, BuildFeatures, and, with the
// engine's GEMM plan and stacked maps, a whole group's rebuild against RebuildGroup. Runs
// without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "common/model/gpu_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/model/model_config.h"
#include "common/model/model_fingerprint.h"
#include "common/model/rope_scaling.h"
#include "common/recovery/features.h"
#include "common/recovery/gpu_rebuild.h"
#include "common/recovery/rebuild.h"
#include "kernels/backend.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/kernel_math.cuh"
#include "tests/kernels/gemm_reference.h"
#include "tests/kernels/op_reference.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

using testing::Nmse;
using testing::RandomVector;

// RoPE shapes: head_dim, rope_dim (< head_dim leaves a tail unrotated), layout, and a scaling
// ("none", "llama3" or "yarn", the latter with its magnitude factor).
using RopeCase = std::tuple<int64_t, int64_t, RopeLayout, std::string>;

class KernelMath : public ::testing::TestWithParam<RopeCase> {
 protected:
  ModelConfig Config() const {
    const auto [head_dim, rope_dim, layout, scaling] = GetParam();
    ModelConfig c;
    c.n_layers = 6;
    c.n_kv_heads = 2;
    c.head_dim = head_dim;
    c.rope_dim = rope_dim;
    c.rope_base = 10000.0;
    c.rope_layout = layout;
    if (scaling != "none") {
      RopeScalingSpec spec{.type = scaling, .factor = 8, .original_context = 64};
      c.rope_scaling = *ComputeRopeScaling(spec, c.rope_base, c.rope_dim);
    }
    return c;
  }
  // What the engine rotates with: the model's dimensions as GpuModel passes them.
  cuda::RopeConfig GpuRope() const { return cuda::RopeFromDims(GpuDims(Config())); }
  std::unique_ptr<Backend> cpu_ = MakeCpuBackend(1, ActivationPrecision::kF32);
};

TEST_P(KernelMath, RopeMatchesTheCpuBackend) {
  const ModelConfig c = Config();
  const int64_t n = 37, heads = 5, width = heads * c.head_dim, stride = width + 8;
  const auto x = RandomVector(n * stride, 3);
  for (const int inverse : {0, 1}) {
    // Explicit positions (1000 + 3t), and pos0 + t with no positions (7 + t).
    for (const bool explicit_positions : {true, false}) {
      std::vector<int32_t> positions(n);
      for (int64_t t = 0; t < n; ++t) {
        positions[t] = static_cast<int32_t>(explicit_positions ? 1000 + 3 * t : 7 + t);
      }
      std::vector<float> want(n * width);  // the CPU works on dense rows
      for (int64_t t = 0; t < n; ++t) {
        std::copy(x.begin() + t * stride, x.begin() + t * stride + width, want.begin() + t * width);
      }
      cpu_->Rope(want.data(), n, heads, positions.data(), c.rope(), inverse != 0);
      std::vector<float> got = x;
      for (int64_t idx = 0; idx < n * heads * (c.rope_dim / 2); ++idx) {
        cuda::RotatePairAt(got.data(), stride, heads,
                           explicit_positions ? positions.data() : nullptr, 7, GpuRope(), inverse,
                           idx);
      }
      std::vector<float> dense(n * width);
      for (int64_t t = 0; t < n; ++t) {
        std::copy(got.begin() + t * stride, got.begin() + t * stride + width,
                  dense.begin() + t * width);
        for (int64_t j = width; j < stride; ++j) {  // the padding after the heads stays as it was
          ASSERT_EQ(got[t * stride + j], x[t * stride + j]);
        }
      }
      EXPECT_LT(Nmse(dense.data(), want.data(), n * width), 1e-12)
          << "inverse " << inverse << " explicit positions " << explicit_positions;
    }
  }
}

TEST_P(KernelMath, GatheredFeaturesMatchBuildFeatures) {
  const ModelConfig c = Config();
  const int64_t w = c.kv_width(), tokens = 50, begin = 11, count = 30;
  auto cache = KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim, 64, DType::kF16);
  ASSERT_TRUE(cache.ok());
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const auto k = RandomVector(tokens * w, 10 + l), v = RandomVector(tokens * w, 20 + l);
    ASSERT_TRUE((*cache)->WriteKeys(l, 0, tokens, k.data()).ok());
    ASSERT_TRUE((*cache)->WriteValues(l, 0, tokens, v.data()).ok());
  }
  ASSERT_TRUE((*cache)->SetTokens(tokens).ok());
  const LayerGroup group{{2, 3}, {1, 4, 5}};
  const int64_t f = FeatureWidth(group, w);
  std::vector<float> want(count * f), got(count * f);
  ASSERT_TRUE(BuildFeatures(**cache, group, c, *cpu_, begin, count, want.data()).ok());
  cuda::LayerPointers anchors{};
  for (size_t a = 0; a < group.anchors.size(); ++a) {
    anchors.k[a] = reinterpret_cast<__half*>((*cache)->KeyRows(group.anchors[a], 0));
    anchors.v[a] = reinterpret_cast<__half*>((*cache)->ValueRows(group.anchors[a], 0));
  }
  for (int64_t idx = 0; idx < count * f; ++idx) {
    got[idx] = cuda::GatherFeatureAt(anchors, static_cast<int>(group.anchors.size()), begin, w,
                                     GpuRope(), idx);
  }
  EXPECT_LT(Nmse(got.data(), want.data(), count * f), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Layouts, KernelMath,
                         ::testing::Values(RopeCase{64, 64, RopeLayout::kInterleaved, "none"},
                                           RopeCase{64, 64, RopeLayout::kHalf, "none"},
                                           RopeCase{32, 16, RopeLayout::kHalf, "none"},
                                           RopeCase{32, 16, RopeLayout::kInterleaved, "none"},
                                           RopeCase{64, 64, RopeLayout::kInterleaved, "llama3"},
                                           RopeCase{64, 64, RopeLayout::kHalf, "yarn"},
                                           RopeCase{32, 16, RopeLayout::kHalf, "yarn"}));

// Every group of a fitted bank rebuilt the way the engine does it (gather, one GEMM over the
// stacked maps, scatter), on the host, against RebuildGroup on the CPU.
TEST(KernelMathRebuild, AGroupsWholeRebuildMatchesRebuildGroup) {
  auto model = Model::Load((riskkv::testing::TestdataDir() / "tiny_llama_deep.gguf").string(),
                           {.threads = 1, .activations = ActivationPrecision::kF32});
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  auto fp = ModelFingerprint(**model);
  ASSERT_TRUE(fp.ok());
  const auto tiny = riskkv::testing::MakeTinyPolicy(**model, *fp, 3, DType::kF16);
  const int64_t w = c.kv_width(), n = 60;
  auto exact = (*model)->NewKvCache(64, DType::kF16);
  ASSERT_TRUE(exact.ok());
  std::vector<int32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((i * 37 + 3) % c.vocab);
  ASSERT_TRUE((*model)->Prefill(tokens, **exact).ok());
  auto want = (*exact)->Clone(), got = (*exact)->Clone();
  ASSERT_TRUE(want.ok() && got.ok());
  const cuda::RopeConfig rope{c.head_dim, c.rope_dim, c.rope_base,
                              c.rope_layout == RopeLayout::kInterleaved};
  for (const FoldedGroup& g : tiny.bank->groups()) {
    ASSERT_TRUE(RebuildGroup(**want, g, c, (*model)->backend(), 0, n).ok());
    std::vector<float> a, bias;
    ASSERT_TRUE(StackGroupMaps(g, w, &a, &bias).ok());
    cuda::LayerPointers anchors{}, targets{};
    for (size_t i = 0; i < g.group.anchors.size(); ++i) {
      anchors.k[i] = reinterpret_cast<__half*>((*got)->KeyRows(g.group.anchors[i], 0));
      anchors.v[i] = reinterpret_cast<__half*>((*got)->ValueRows(g.group.anchors[i], 0));
    }
    for (size_t i = 0; i < g.group.targets.size(); ++i) {
      targets.k[i] = reinterpret_cast<__half*>((*got)->KeyRows(g.group.targets[i], 0));
      targets.v[i] = reinterpret_cast<__half*>((*got)->ValueRows(g.group.targets[i], 0));
    }
    const int64_t f = FeatureWidth(g.group, w), out = static_cast<int64_t>(bias.size());
    std::vector<float> features(n * f), rebuilt(n * out);
    for (int64_t idx = 0; idx < n * f; ++idx) {
      features[idx] =
          cuda::GatherFeatureAt(anchors, static_cast<int>(g.group.anchors.size()), 0, w, rope, idx);
    }
    riskkv::testing::ColumnMajorGemm(cuda::RebuildPlan(n, out, f), 1.0f, a.data(), features.data(),
                                     0.0f, rebuilt.data());
    for (int64_t idx = 0; idx < n * out; ++idx) {
      cuda::ScatterRebuiltAt(rebuilt.data(), bias.data(), targets,
                             static_cast<int>(g.group.targets.size()), 0, w, rope, idx);
    }
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (bool values : {false, true}) {
      std::vector<float> x(n * w), y(n * w);
      ASSERT_TRUE(
          (values ? (*got)->ReadValues(l, 0, n, x.data()) : (*got)->ReadKeys(l, 0, n, x.data()))
              .ok());
      ASSERT_TRUE(
          (values ? (*want)->ReadValues(l, 0, n, y.data()) : (*want)->ReadKeys(l, 0, n, y.data()))
              .ok());
      // Both write f16 rows from f32 sums in different orders: one f16 step (2^-11) at most.
      EXPECT_LT(Nmse(x.data(), y.data(), n * w), 1e-7) << "layer " << l << (values ? " V" : " K");
    }
  }
}

TEST(KernelMathStore, KThenVOfEachRowIntoTheirCaches) {
  const int64_t n = 7, width = 24, stride = 100;
  auto src = RandomVector(n * stride, 41, 3.0f);
  src[2 * stride + 5] = 1e6f;  // saturates instead of becoming infinity
  std::vector<__half> k(n * width), v(n * width);
  for (int64_t idx = 0; idx < n * 2 * width; ++idx) {
    cuda::StoreKvAt(src.data(), width, stride, k.data(), v.data(), idx);
  }
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < width; ++j) {
      const float want_k = i == 2 && j == 5 ? 65504.0f : F16ToF32(F32ToF16(src[i * stride + j]));
      EXPECT_EQ(__half2float(k[i * width + j]), want_k) << i << "," << j;
      EXPECT_EQ(__half2float(v[i * width + j]), F16ToF32(F32ToF16(src[i * stride + width + j])));
    }
  }
}

}  // namespace
}  // namespace riskkv
