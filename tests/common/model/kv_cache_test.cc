// KvCache layout, dtype conversion at the edges and range checks.
#include "common/model/kv_cache.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <vector>

#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

TEST(KvCache, LayoutIsTokenMajorPerLayer) {
  auto cache = KvCache::Create(3, 2, 4, 10, DType::kF32);
  ASSERT_TRUE(cache.ok());
  KvCache& c = **cache;
  EXPECT_EQ(c.width(), 8);
  EXPECT_EQ(c.token_bytes(), 32);
  EXPECT_EQ(c.allocated_bytes(), 2 * 3 * 10 * 32);
  std::vector<float> rows(2 * 8);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  ASSERT_TRUE(c.WriteKeys(1, 4, 2, rows.data()).ok());
  // Row t of layer l starts at t * token_bytes in that layer's own allocation.
  const float* raw = reinterpret_cast<const float*>(c.KeyRows(1, 4));
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(raw[i], rows[i]);
  ASSERT_TRUE(c.SetTokens(6).ok());
  const KvView view = c.KeyView(1);
  EXPECT_EQ(view.n_tokens, 6);
  EXPECT_EQ(static_cast<const float*>(view.data)[4 * 8 + 3], 3.0f);
  // Other layers untouched.
  std::vector<float> other(8);
  ASSERT_TRUE(c.ReadKeys(0, 4, 1, other.data()).ok());
  for (float v : other) EXPECT_EQ(v, 0.0f);
}

TEST(KvCache, F16StorageRoundsOnce) {
  auto cache = KvCache::Create(1, 1, 64, 4, DType::kF16);
  ASSERT_TRUE(cache.ok());
  const auto x = testing::RandomVector(2 * 64, 3);
  ASSERT_TRUE((*cache)->WriteValues(0, 1, 2, x.data()).ok());
  std::vector<float> y(2 * 64);
  ASSERT_TRUE((*cache)->ReadValues(0, 1, 2, y.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i], F16ToF32(F32ToF16(x[i])));
  EXPECT_EQ((*cache)->token_bytes(), 128);
}

TEST(KvCache, RejectsBadArguments) {
  EXPECT_FALSE(KvCache::Create(1, 1, 4, 4, DType::kQ4_1).ok());
  EXPECT_FALSE(KvCache::Create(0, 1, 4, 4, DType::kF32).ok());
  EXPECT_FALSE(KvCache::Create(1, 1, 4, -1, DType::kF32).ok());
  auto cache = KvCache::Create(2, 1, 4, 4, DType::kF32);
  ASSERT_TRUE(cache.ok());
  std::vector<float> buf(5 * 4);
  EXPECT_EQ((*cache)->WriteKeys(0, 2, 3, buf.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*cache)->ReadValues(2, 0, 1, buf.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*cache)->ReadValues(-1, 0, 1, buf.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*cache)->SetTokens(5).code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE((*cache)->SetTokens(4).ok());
}

TEST(KvCache, CloneAndCopyFrom) {
  auto a = KvCache::Create(2, 1, 8, 6, DType::kF16);
  ASSERT_TRUE(a.ok());
  const auto x = testing::RandomVector(3 * 8, 4);
  ASSERT_TRUE((*a)->WriteKeys(1, 0, 3, x.data()).ok());
  ASSERT_TRUE((*a)->SetTokens(3).ok());
  auto b = (*a)->Clone();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->n_tokens(), 3);
  std::vector<float> ya(3 * 8), yb(3 * 8);
  ASSERT_TRUE((*a)->ReadKeys(1, 0, 3, ya.data()).ok());
  ASSERT_TRUE((*b)->ReadKeys(1, 0, 3, yb.data()).ok());
  EXPECT_EQ(ya, yb);
  // Independent storage: writing the copy leaves the original alone.
  std::vector<float> zeros(8, 0.0f);
  ASSERT_TRUE((*b)->WriteKeys(1, 0, 1, zeros.data()).ok());
  ASSERT_TRUE((*a)->ReadKeys(1, 0, 3, yb.data()).ok());
  EXPECT_EQ(ya, yb);
  ASSERT_TRUE((*b)->CopyFrom(**a).ok());
  ASSERT_TRUE((*b)->ReadKeys(1, 0, 3, yb.data()).ok());
  EXPECT_EQ(ya, yb);
  auto other = KvCache::Create(2, 1, 8, 6, DType::kF32);
  EXPECT_FALSE((*other)->CopyFrom(**a).ok());
}

// Resident memory of this process, bytes.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(KvCache, UntouchedRowsCostNothingAndAClosedCacheGoesBackToTheOs) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's shadow memory is in the figures";
#endif
  // 8 layers x 4,096 rows x 256 f32 = 64 MiB per cache.
  constexpr int64_t kBytes = 2 * 8 * 4096 * 256 * 4;
  const int64_t base = ResidentBytes();
  std::vector<std::unique_ptr<KvCache>> caches;
  for (int i = 0; i < 6; ++i) {
    auto c = KvCache::Create(8, 4, 64, 4096, DType::kF32);
    ASSERT_TRUE(c.ok()) << c.status();
    caches.push_back(*std::move(c));
  }
  EXPECT_LT(ResidentBytes() - base, kBytes / 8) << "six empty caches";
  const std::vector<float> row(256, 1.5f);
  for (auto& c : caches) {
    for (int64_t l = 0; l < 8; ++l) {
      for (int64_t t = 0; t < 4096; ++t) {
        ASSERT_TRUE(c->WriteKeys(l, t, 1, row.data()).ok());
        ASSERT_TRUE(c->WriteValues(l, t, 1, row.data()).ok());
      }
    }
  }
  EXPECT_GT(ResidentBytes() - base, 5 * kBytes) << "six full caches";
  caches.clear();
  EXPECT_LT(ResidentBytes() - base, kBytes / 8) << "closed: the pages went back";
}

}  // namespace
}  // namespace riskkv
