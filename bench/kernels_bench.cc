// Google Benchmark of the CPU backend's MatMul on SmolLM2's shapes: each weight type with exact
// f32 activations and with 8-bit activations, for a decode row (n = 1) and a prefill batch.
//   build/release/bench/riskkv-kernels-bench --benchmark_filter=Q4_1
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kernels/backend.h"
#include "tests/kernels/op_reference.h"

namespace riskkv {
namespace {

void BM_MatMul(benchmark::State& state, DType dtype, ActivationPrecision precision) {
  const int64_t n = state.range(0), rows = state.range(1), cols = state.range(2);
  const auto values = testing::RandomVector(rows * cols, 1, 0.05f);
  std::vector<uint8_t> bytes;
  for (int64_t r = 0; r < rows; ++r) {
    const auto q = testing::QuantizeRow(dtype, values.data() + r * cols, cols);
    bytes.insert(bytes.end(), q.begin(), q.end());
  }
  const WeightMatrix w{dtype, bytes.data(), rows, cols};
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

// {n, rows, cols, threads}: SmolLM2 FFN up-projection (1536 x 576) and down (576 x 1536).
void Shapes(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 2}) {
    b->Args({1, 1536, 576, threads});
    b->Args({1, 576, 1536, threads});
    b->Args({512, 1536, 576, threads});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_MatMul, Q4_1_f32, DType::kQ4_1, ActivationPrecision::kF32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q4_1_int8, DType::kQ4_1, ActivationPrecision::kInt8)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q8_0_f32, DType::kQ8_0, ActivationPrecision::kF32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q8_0_int8, DType::kQ8_0, ActivationPrecision::kInt8)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, Q4_0_int8, DType::kQ4_0, ActivationPrecision::kInt8)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_MatMul, F16_f32, DType::kF16, ActivationPrecision::kF32)->Apply(Shapes);

}  // namespace
}  // namespace riskkv

BENCHMARK_MAIN();
