// Google Benchmark of the CPU backend's MatMul on SmolLM2's shapes: each weight type with exact
// f32 activations and with 8-bit activations, for a decode row (n = 1) and a prefill batch; and
// of one layer's attention over an f16 or f32 cache for a decode step and a prefill block, at
// the history lengths a migration moves.
//   build/release/bench/riskkv-kernels-bench --benchmark_filter=Q4_1
//   build/release/bench/riskkv-kernels-bench --benchmark_filter=Q4_1_int8   (rows and panels)
//   build/release/bench/riskkv-kernels-bench --benchmark_filter=Attention
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/panels.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

// panels: the weights also regrouped for the AVX-512 VNNI kernel (cpu/panels.h), as the
// model loader does for 8-bit arithmetic; the same products bit for bit.
void MatMulBench(benchmark::State& state, DType dtype, ActivationPrecision precision, bool panels) {
  const int64_t n = state.range(0), rows = state.range(1), cols = state.range(2);
  const auto values = testing::RandomVector(rows * cols, 1, 0.05f);
  std::vector<uint8_t> bytes;
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = testing::QuantizeRow(dtype, values.data() + r * cols, cols);
    bytes.insert(bytes.end(), q.begin(), q.end());
  }
  WeightMatrix w{dtype, bytes.data(), rows, cols};
  cpu::Panels packed;
  if (panels) {
    packed = cpu::PackPanels(dtype, bytes.data(), rows, cols);
    w.panels = packed.get();
  }
  const auto x = testing::RandomVector(n * cols, 2);
  std::vector<float> y(n * rows);
  auto backend = MakeCpuBackend(static_cast<int>(state.range(3)), precision);
  for (auto _ : state) {
    backend->MatMul(x.data(), n, w, nullptr, y.data());
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * n * rows * cols);  // multiply-adds
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(bytes.size()));
}

void BM_MatMul(benchmark::State& state, DType dtype, ActivationPrecision precision) {
  MatMulBench(state, dtype, precision, false);
}

void BM_MatMulPanels(benchmark::State& state, DType dtype) {
  MatMulBench(state, dtype, ActivationPrecision::kInt8, true);
}

// {n, rows, cols, threads}: SmolLM2 FFN up-projection (1536 x 576) and down (576 x 1536); n = 1
// is a decode step, 8 and 16 a batch step of that many sessions, 512 a prefill.
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 2}) {
    b->Args({1, 1536, 576, threads});
    b->Args({1, 576, 1536, threads});
    b->Args({8, 1536, 576, threads});  // a step of eight decoding sessions
    b->Args({16, 1536, 576, threads});
    b->Args({512, 1536, 576, threads});
  }
  b->Unit(benchmark::kMicrosecond);
}

// One layer of SmolLM2's attention (9 query heads over 3 KV heads of 64): n queries at the end
// of a history of ctx tokens, so a decode step is n = 1.
void BM_Attention(benchmark::State& state, DType kv_dtype) {
  const int64_t n = state.range(0), ctx = state.range(1);
  constexpr int64_t kHeads = 9, kKvHeads = 3, kHeadDim = 64;
  const auto q = testing::RandomVector(n * kHeads * kHeadDim, 3);
  const auto k = testing::RandomVector(ctx * kKvHeads * kHeadDim, 4);
  const auto v = testing::RandomVector(ctx * kKvHeads * kHeadDim, 5);
  std::vector<uint16_t> k16(k.size()), v16(v.size());
  F32ToF16Row(k.data(), k16.data(), static_cast<int64_t>(k.size()));
  F32ToF16Row(v.data(), v16.data(), static_cast<int64_t>(v.size()));
  const bool f16 = kv_dtype == DType::kF16;
  const KvView kk{kv_dtype, f16 ? static_cast<const void*>(k16.data()) : k.data(), ctx};
  const KvView vv{kv_dtype, f16 ? static_cast<const void*>(v16.data()) : v.data(), ctx};
  std::vector<float> out(n * kHeads * kHeadDim);
  auto backend = MakeCpuBackend(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    backend->Attention(q.data(), n, ctx - n, kk, vv, kHeads, kKvHeads, kHeadDim, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);  // queries
}

// {n, ctx, threads}: decode steps at 512, 2,048 and 8,000 tokens; a 128-query prefill block.
void AttentionShapes(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 2}) {
    for (int64_t ctx : {512, 2048, 8000}) b->Args({1, ctx, threads});
    b->Args({128, 2048, threads});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Attention, F16, DType::kF16)->Apply(AttentionShapes);
BENCHMARK_CAPTURE(BM_Attention, F32, DType::kF32)->Apply(AttentionShapes);
BENCHMARK_CAPTURE(BM_MatMul, Q4_1_f32, DType::kQ4_1, ActivationPrecision::kF32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q4_1_int8, DType::kQ4_1, ActivationPrecision::kInt8)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMulPanels, Q4_1_int8_panels, DType::kQ4_1)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q8_0_f32, DType::kQ8_0, ActivationPrecision::kF32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q8_0_int8, DType::kQ8_0, ActivationPrecision::kInt8)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMulPanels, Q8_0_int8_panels, DType::kQ8_0)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q4_0_int8, DType::kQ4_0, ActivationPrecision::kInt8)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, F16_f32, DType::kF16, ActivationPrecision::kF32)->Apply(Shapes);

}  // namespace
}  // namespace riskkv

BENCHMARK_MAIN();
