// The CPU backend is batch-invariant: an op's result for a row is the same bits whether the row
// is computed alone, in a batch of any size, at any offset of a split, or with any thread count.
// This is what lets a migrated session (FULL_KV, TOKEN_REPLAY) reproduce its source exactly.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

using testing::QuantizeRow;
using testing::RandomVector;

// The ways a batch of n rows is cut into consecutive calls: whole, one row at a time, and uneven
// pieces that cross the backend's small-batch and tile thresholds.
std::vector<std::vector<int64_t>> Splits(int64_t n) {
  std::vector<std::vector<int64_t>> out = {{n}, std::vector<int64_t>(n, 1)};
  std::vector<int64_t> uneven;
  for (int64_t left = n, piece = 1; left > 0; piece = piece * 3 % 11 + 1) {
    uneven.push_back(std::min(piece, left));
    left -= uneven.back();
  }
  out.push_back(uneven);
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class MatMulInvarianceTest
    : public ::testing::TestWithParam<std::tuple<DType, ActivationPrecision>> {};

TEST_P(MatMulInvarianceTest, RowsDoNotDependOnTheBatchOrThreads) {
  const auto [dtype, precision] = GetParam();
  const int64_t n = 37, rows = 150, cols = BlockSize(dtype) > 32 ? 256 : 96;
  const auto values = RandomVector(rows * cols, 21, 0.5f);
  std::vector<uint8_t> bytes;
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = QuantizeRow(dtype, values.data() + r * cols, cols);
    bytes.insert(bytes.end(), q.begin(), q.end());
  }
  const WeightMatrix w{dtype, bytes.data(), rows, cols};
  const auto x = RandomVector(n * cols, 22);
  const auto bias = RandomVector(rows, 23);
  std::vector<float> reference;
  for (int threads : {1, 2, 3}) {
    auto be = MakeCpuBackend(threads, precision);
    for (const auto& split : Splits(n)) {
      std::vector<float> y(n * rows);
      int64_t done = 0;
      for (int64_t m : split) {
        be->MatMul(x.data() + done * cols, m, w, bias.data(), y.data() + done * rows);
        done += m;
      }
      if (reference.empty()) {
        reference = y;
        continue;
      }
      EXPECT_TRUE(SameBits(y, reference))
          << DTypeName(dtype) << " threads=" << threads << " pieces=" << split.size();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    TypesAndPrecisions, MatMulInvarianceTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                         DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                         DType::kQ4_K, DType::kQ5_K, DType::kQ6_K),
                       ::testing::Values(ActivationPrecision::kF32, ActivationPrecision::kInt8)),
    [](const auto& info) {
      return std::string(DTypeName(std::get<0>(info.param))) +
             (std::get<1>(info.param) == ActivationPrecision::kInt8 ? "_int8" : "_f32");
    });

class AttentionInvarianceTest : public ::testing::TestWithParam<DType> {};

// A prefill of n queries against a split of the same queries at increasing offsets (a prefill
// in micro-batches, then decode steps), over the same cache: every output row identical.
TEST_P(AttentionInvarianceTest, QueriesDoNotDependOnTheBatchOrThreads) {
  const DType kv_dtype = GetParam();
  const int64_t n = 300, n_heads = 6, n_kv_heads = 2, hd = 64;
  const auto q = RandomVector(n * n_heads * hd, 31);
  const auto k = RandomVector(n * n_kv_heads * hd, 32);
  const auto v = RandomVector(n * n_kv_heads * hd, 33);
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  F32ToF16Row(k.data(), k16.data(), k.size());
  F32ToF16Row(v.data(), v16.data(), v.size());
  const bool f16 = kv_dtype == DType::kF16;
  const KvView kv_k{kv_dtype, f16 ? static_cast<const void*>(k16.data()) : k.data(), n};
  const KvView kv_v{kv_dtype, f16 ? static_cast<const void*>(v16.data()) : v.data(), n};
  const int64_t row = n_heads * hd;
  std::vector<float> reference;
  for (int threads : {1, 2, 3}) {
    auto be = MakeCpuBackend(threads);
    for (const auto& split : Splits(n)) {
      std::vector<float> out(n * row);
      int64_t done = 0;
      for (int64_t m : split) {
        be->Attention(q.data() + done * row, m, done, kv_k, kv_v, n_heads, n_kv_heads, hd,
                      out.data() + done * row);
        done += m;
      }
      if (reference.empty()) {
        reference = out;
        continue;
      }
      EXPECT_TRUE(SameBits(out, reference)) << "threads=" << threads << " pieces=" << split.size();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KvTypes, AttentionInvarianceTest,
                         ::testing::Values(DType::kF32, DType::kF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// Several sessions' attention in one call (a batch step: decodes, a few queries, a prefill
// chunk; f32 and f16 caches of different lengths): each session's output the same bits as
// Attention gives it alone.
TEST(BatchInvariance, AttentionManyEqualsEachSessionAlone) {
  const int64_t n_heads = 6, n_kv_heads = 2, hd = 64, row = n_heads * hd;
  struct Session {
    DType dtype = DType::kF32;
    int64_t n = 0, q_pos0 = 0;
    std::vector<float> q, k, v;
    std::vector<uint16_t> k16, v16;
    KvView kv_k, kv_v;
  };
  const std::tuple<DType, int64_t, int64_t> shapes[] = {
      {DType::kF16, 1, 130}, {DType::kF32, 1, 7}, {DType::kF16, 3, 200},
      {DType::kF16, 40, 60}, {DType::kF32, 1, 0}, {DType::kF16, 1, 301}};
  std::vector<Session> sessions;
  uint32_t seed = 60;
  for (const auto& [dtype, n, q_pos0] : shapes) {
    Session s;
    s.dtype = dtype;
    s.n = n;
    s.q_pos0 = q_pos0;
    const int64_t ctx = q_pos0 + n;
    s.q = RandomVector(n * row, seed++);
    s.k = RandomVector(ctx * n_kv_heads * hd, seed++);
    s.v = RandomVector(ctx * n_kv_heads * hd, seed++);
    s.k16.resize(s.k.size());
    s.v16.resize(s.v.size());
    F32ToF16Row(s.k.data(), s.k16.data(), s.k.size());
    F32ToF16Row(s.v.data(), s.v16.data(), s.v.size());
    sessions.push_back(std::move(s));
  }
  for (Session& s : sessions) {
    const bool f16 = s.dtype == DType::kF16;
    const int64_t ctx = s.q_pos0 + s.n;
    s.kv_k = {s.dtype, f16 ? static_cast<const void*>(s.k16.data()) : s.k.data(), ctx};
    s.kv_v = {s.dtype, f16 ? static_cast<const void*>(s.v16.data()) : s.v.data(), ctx};
  }
  for (int threads : {1, 2, 3}) {
    auto be = MakeCpuBackend(threads);
    std::vector<std::vector<float>> alone, together;
    std::vector<AttentionCall> calls;
    for (const Session& s : sessions) {
      alone.emplace_back(s.n * row);
      be->Attention(s.q.data(), s.n, s.q_pos0, s.kv_k, s.kv_v, n_heads, n_kv_heads, hd,
                    alone.back().data());
      together.emplace_back(s.n * row, -1.0f);
    }
    for (size_t i = 0; i < sessions.size(); ++i) {
      const Session& s = sessions[i];
      calls.push_back({s.q.data(), s.n, s.q_pos0, s.kv_k, s.kv_v, together[i].data()});
    }
    be->AttentionMany(calls, n_heads, n_kv_heads, hd);
    for (size_t i = 0; i < sessions.size(); ++i) {
      EXPECT_TRUE(SameBits(together[i], alone[i])) << "session " << i << " threads=" << threads;
    }
  }
}

// The row-wise ops, over the same splits and thread counts.
TEST(BatchInvariance, RowWiseOps) {
  const int64_t n = 41, d = 576, heads = 9, hd = 64;
  const auto x = RandomVector(n * d, 41);
  const auto weight = RandomVector(d, 42);
  const auto up = RandomVector(n * d, 43);
  std::vector<int32_t> positions(n);
  for (int64_t i = 0; i < n; ++i) positions[i] = static_cast<int32_t>(3 * i + 1);
  const RopeParams rope{10000.0, hd, hd, RopeLayout::kInterleaved};
  std::vector<float> reference;
  for (int threads : {1, 2, 3}) {
    auto be = MakeCpuBackend(threads);
    for (const auto& split : Splits(n)) {
      std::vector<float> norm(n * d), rotated = x, glu(n * d);
      int64_t done = 0;
      for (int64_t m : split) {
        be->RmsNorm(x.data() + done * d, m, d, weight.data(), 1e-5f, norm.data() + done * d);
        be->Rope(rotated.data() + done * d, m, heads, positions.data() + done, rope, false);
        be->SwiGlu(x.data() + done * d, up.data() + done * d, m * d, glu.data() + done * d);
        done += m;
      }
      std::vector<float> all = norm;
      all.insert(all.end(), rotated.begin(), rotated.end());
      all.insert(all.end(), glu.begin(), glu.end());
      if (reference.empty()) {
        reference = all;
        continue;
      }
      EXPECT_TRUE(SameBits(all, reference)) << "threads=" << threads << " pieces=" << split.size();
    }
  }
}

}  // namespace
}  // namespace riskkv
