// The per-element math of the GPU's RoPE, feature-gather, rebuilt-scatter and K/V-store kernels
// (kernels/cuda/kernel_math.cuh, the same functions the kernels call), run on the host over every
// element and checked against the CPU oracle: Backend::Rope, BuildFeatures, and RebuildGroup's
// steps after its GEMM. Runs without a GPU.
#include <gtest/gtest.h>

#include <tuple>

#include "common/kv_cache.h"
#include "common/model_config.h"
#include "common/recovery/features.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernel_math.cuh"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

using testing::Nmse;
using testing::RandomVector;

// RoPE shapes: head_dim, rope_dim (< head_dim leaves a tail unrotated), layout.
using RopeCase = std::tuple<int64_t, int64_t, RopeLayout>;

class KernelMath : public ::testing::TestWithParam<RopeCase> {
 protected:
  ModelConfig Config() const {
    const auto [head_dim, rope_dim, layout] = GetParam();
    ModelConfig c;
    c.n_layers = 6;
    c.n_kv_heads = 2;
    c.head_dim = head_dim;
    c.rope_dim = rope_dim;
    c.rope_base = 10000.0;
    c.rope_layout = layout;
    return c;
  }
  cuda::RopeConfig GpuRope() const {
    const ModelConfig c = Config();
    return {c.head_dim, c.rope_dim, c.rope_base, c.rope_layout == RopeLayout::kInterleaved};
  }
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

TEST_P(KernelMath, ScatteredRowsMatchRebuildGroupsSteps) {
  const ModelConfig c = Config();
  const int64_t w = c.kv_width(), begin = 5, count = 21, n_targets = 2;
  const int32_t targets[] = {2, 3};
  const auto y = RandomVector(count * n_targets * 2 * w, 31);
  const auto bias = RandomVector(n_targets * 2 * w, 32);
  // CPU: RebuildGroup's steps after its GEMM: bias, RoPE on the keys, f16 rows into the cache.
  auto want = KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim, 64, DType::kF16);
  auto got = KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim, 64, DType::kF16);
  ASSERT_TRUE(want.ok() && got.ok());
  std::vector<int32_t> positions(count);
  for (int64_t t = 0; t < count; ++t) positions[t] = static_cast<int32_t>(begin + t);
  for (int64_t j = 0; j < n_targets; ++j) {
    std::vector<float> k(count * w), v(count * w);
    for (int64_t t = 0; t < count; ++t) {
      for (int64_t e = 0; e < w; ++e) {
        k[t * w + e] = y[(t * n_targets + j) * 2 * w + e] + bias[2 * j * w + e];
        v[t * w + e] = y[(t * n_targets + j) * 2 * w + w + e] + bias[(2 * j + 1) * w + e];
      }
    }
    cpu_->Rope(k.data(), count, c.n_kv_heads, positions.data(), c.rope(), false);
    ASSERT_TRUE((*want)->WriteKeys(targets[j], begin, count, k.data()).ok());
    ASSERT_TRUE((*want)->WriteValues(targets[j], begin, count, v.data()).ok());
  }
  cuda::LayerPointers ptrs{};
  for (int64_t j = 0; j < n_targets; ++j) {
    ptrs.k[j] = reinterpret_cast<__half*>((*got)->KeyRows(targets[j], 0));
    ptrs.v[j] = reinterpret_cast<__half*>((*got)->ValueRows(targets[j], 0));
  }
  for (int64_t idx = 0; idx < count * n_targets * 2 * w; ++idx) {
    cuda::ScatterRebuiltAt(y.data(), bias.data(), ptrs, static_cast<int>(n_targets), begin, w,
                           GpuRope(), idx);
  }
  for (int32_t layer : targets) {
    for (bool values : {false, true}) {
      std::vector<float> a(count * w), b(count * w);
      ASSERT_TRUE((values ? (*got)->ReadValues(layer, begin, count, a.data())
                          : (*got)->ReadKeys(layer, begin, count, a.data()))
                      .ok());
      ASSERT_TRUE((values ? (*want)->ReadValues(layer, begin, count, b.data())
                          : (*want)->ReadKeys(layer, begin, count, b.data()))
                      .ok());
      // Both round the same f32 values to f16; fused multiply-adds on either side may move a
      // value across a rounding boundary, one f16 step (2^-11 relative) at most.
      EXPECT_LT(Nmse(a.data(), b.data(), count * w), 1e-7)
          << "layer " << layer << (values ? " V" : " K");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, KernelMath,
                         ::testing::Values(RopeCase{64, 64, RopeLayout::kInterleaved},
                                           RopeCase{64, 64, RopeLayout::kHalf},
                                           RopeCase{32, 16, RopeLayout::kHalf},
                                           RopeCase{32, 16, RopeLayout::kInterleaved}));

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
