// ApplyWireForm leaves a cache as a migration in that form would: the chosen layers' rows put
// through the codec and stored back in the cache's dtype, every other row untouched.
#include "common/recovery/wire_apply.h"

#include <gtest/gtest.h>

#include <array>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/kvcodec/kv_codec.h"
#include "common/kvcodec/transform_codec.h"

namespace riskkv {
namespace {

std::unique_ptr<KvCache> RandomCache(DType dtype, int64_t tokens) {
  auto cache = KvCache::Create(4, 2, 16, tokens + 8, dtype);
  EXPECT_TRUE(cache.ok()) << cache.status();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> rows(tokens * (*cache)->width());
  for (int64_t l = 0; l < 4; ++l) {
    for (float& v : rows) v = normal(rng);
    EXPECT_TRUE((*cache)->WriteKeys(l, 0, tokens, rows.data()).ok());
    for (float& v : rows) v = normal(rng);
    EXPECT_TRUE((*cache)->WriteValues(l, 0, tokens, rows.data()).ok());
  }
  EXPECT_TRUE((*cache)->SetTokens(tokens).ok());
  return std::move(*cache);
}

std::vector<float> Rows(const KvCache& cache, int64_t layer, bool values, int64_t count) {
  std::vector<float> out(count * cache.width());
  EXPECT_TRUE((values ? cache.ReadValues(layer, 0, count, out.data())
                      : cache.ReadKeys(layer, 0, count, out.data()))
                  .ok());
  return out;
}

TEST(ApplyWireForm, QuantizesTheChosenLayersRowsAndNothingElse) {
  for (DType dtype : {DType::kF16, DType::kF32}) {
    for (WireForm form : {WireForm::kInt8, WireForm::kInt4}) {
      SCOPED_TRACE(std::string(WireFormName(form)) + (dtype == DType::kF16 ? " f16" : " f32"));
      const int64_t tokens = 75, rows = 70;  // rows: what moves; the last few stay exact
      const auto original = RandomCache(dtype, tokens);
      auto cache = original->Clone();
      ASSERT_TRUE(cache.ok());
      const std::vector<int32_t> layers = {0, 2};
      ASSERT_TRUE(ApplyWireForm(form, layers, rows, **cache).ok());
      for (int64_t l = 0; l < 4; ++l) {
        for (bool values : {false, true}) {
          const auto before = Rows(*original, l, values, tokens);
          const auto after = Rows(**cache, l, values, tokens);
          const bool chosen = l == 0 || l == 2;
          // The expectation, built independently: the codec on the f32 rows, then the cache's
          // dtype through a fresh cache.
          auto expect = before;
          if (chosen) {
            ASSERT_TRUE(RoundTrip(form, values, expect.data(), 0, rows, 2, 16, dtype).ok());
            auto scratch = KvCache::Create(1, 2, 16, tokens, dtype);
            ASSERT_TRUE(scratch.ok());
            ASSERT_TRUE((*scratch)->WriteKeys(0, 0, tokens, expect.data()).ok());
            ASSERT_TRUE((*scratch)->ReadKeys(0, 0, tokens, expect.data()).ok());
          }
          EXPECT_EQ(after, expect) << "layer " << l << (values ? " values" : " keys");
          if (chosen) {
            EXPECT_NE(after, before) << "layer " << l << " was not quantized";
          }
        }
      }
    }
  }
}

TEST(ApplyWireForm, PlainChangesNothingAndBadRangesAreRefused) {
  const auto original = RandomCache(DType::kF16, 40);
  auto cache = original->Clone();
  ASSERT_TRUE(cache.ok());
  const std::vector<int32_t> all = {0, 1, 2, 3};
  ASSERT_TRUE(ApplyWireForm(WireForm::kPlain, all, 39, **cache).ok());
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(Rows(**cache, l, false, 40), Rows(*original, l, false, 40));
    EXPECT_EQ(Rows(**cache, l, true, 40), Rows(*original, l, true, 40));
  }
  const std::vector<int32_t> outside = {4};
  absl::Status s = ApplyWireForm(WireForm::kInt8, outside, 39, **cache);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 4"), std::string::npos) << s;
  s = ApplyWireForm(WireForm::kInt8, all, 41, **cache);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("41 rows"), std::string::npos) << s;
}

// The transform form: each chosen layer's rows are what its wire chunk decodes to (in the cache's
// dtype), with the bytes that chunk takes; without transforms of the cache's shape it is refused.
TEST(ApplyWireForm, TransformCodesEachChosenLayerWithItsOwnTransform) {
  const int64_t tokens = 60, rows = 57;
  const auto original = RandomCache(DType::kF32, tokens);
  BankTransforms bt;
  for (int64_t l = 0; l < 4; ++l) {
    std::array<LayerTransform, 2> layer;
    for (bool values : {false, true}) {
      const auto r = Rows(*original, l, values, tokens);
      auto t = FitTransform(values ? TransformKind::kHadamard : TransformKind::kPca, r.data(),
                            tokens, 2, 16);
      ASSERT_TRUE(t.ok());
      layer[values ? 1 : 0] = *t;
    }
    bt.layers.push_back(std::move(layer));
  }
  const WireTransforms wt{&bt, 0.5};
  auto cache = original->Clone();
  ASSERT_TRUE(cache.ok());
  const std::vector<int32_t> layers = {1, 3};
  int64_t bytes = 0;
  ASSERT_TRUE(ApplyWireForm(WireForm::kTransform, layers, rows, **cache, &wt, &bytes).ok());
  int64_t expected_bytes = 0;
  for (int64_t l = 0; l < 4; ++l) {
    for (bool values : {false, true}) {
      const auto before = Rows(*original, l, values, tokens);
      auto expect = before;
      if (l == 1 || l == 3) {
        const LayerTransform& t = bt.layers[l][values ? 1 : 0];
        const float step = TransformStep(t, 0.5);
        // Cut in two chunks as a sender with small chunks would: the same rows.
        for (auto [first, count] : {std::pair<int64_t, int64_t>{0, 20}, {20, rows - 20}}) {
          std::string chunk;
          ASSERT_TRUE(
              EncodeTransformChunk(t, step, before.data() + first * 32, first, count, 3, &chunk)
                  .ok());
          ASSERT_TRUE(
              DecodeTransformChunk(t, step, chunk, first, count, expect.data() + first * 32).ok());
        }
        std::string whole;
        ASSERT_TRUE(
            EncodeTransformChunk(t, step, before.data(), 0, rows, kTransformWireZstdLevel, &whole)
                .ok());
        expected_bytes += static_cast<int64_t>(whole.size());
      }
      EXPECT_EQ(Rows(**cache, l, values, tokens), expect)
          << "layer " << l << (values ? " values" : " keys");
    }
  }
  EXPECT_EQ(bytes, expected_bytes);
  EXPECT_LT(bytes, 2 * 2 * rows * 32 * 2);  // below f16

  BankTransforms short_of_layers = bt;
  short_of_layers.layers.pop_back();
  const WireTransforms missing_layer{&short_of_layers, 0.5};
  for (const WireTransforms* bad : {static_cast<const WireTransforms*>(nullptr), &missing_layer}) {
    const absl::Status s = ApplyWireForm(WireForm::kTransform, layers, rows, **cache, bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("needs transforms"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace riskkv
