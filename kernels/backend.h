// The op interface the engine runs on. Each backend (CPU here; CUDA behind the same contract)
// implements these; the CPU backend is the oracle the others are checked against.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kernels/dtype.h"

namespace riskkv {

// A weight matrix as stored in the model file: [rows = out_features, cols = in_features],
// row-major, each row RowBytes(dtype, cols) bytes. Not owned.
struct WeightMatrix {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  // Optional: the same rows regrouped in panels for the CPU's kernels (cpu/panels.h), owned with
  // the weights; quantized types for 8-bit products, F16 and BF16 for f32 ones. Changes only
  // the speed of MatMuls, never a bit.
  const uint8_t* panels = nullptr;
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * RowBytes(dtype, cols);
  }
};

// One layer's keys or values for positions [0, n_tokens): [n_tokens, n_kv_heads, head_dim],
// row-major, dtype F32 or F16. Not owned.
struct KvView {
  DType dtype = DType::kF32;
  const void* data = nullptr;
  int64_t n_tokens = 0;
};

// Which dimensions RoPE rotates together. GGUF llama weights are permuted for kInterleaved
// (pairs (2i, 2i+1)); Hugging Face weights and GGUF qwen2 use kHalf (pairs (i, i + d/2)).
enum class RopeLayout : uint8_t { kInterleaved, kHalf };

struct RopeParams {
  double base = 10000.0;
  int64_t head_dim = 0;
  int64_t rot_dim = 0;  // leading dimensions rotated (== head_dim for Llama/Qwen2)
  RopeLayout layout = RopeLayout::kHalf;
  // Scaled RoPE (Llama 3 frequency factors, linear, YaRN): pair i turns by position *
  // base^(-2i / rot_dim) / freq_divisors[i] (all 1 when null), and cos and sin are multiplied by
  // attn_factor (YaRN's magnitude scaling; the inverse divides by it).
  const double* freq_divisors = nullptr;  // rot_dim / 2 values, owned by the model's config
  double attn_factor = 1.0;
};

// How activations meet quantized (Q4_0, Q4_1, Q8_0) weights in MatMul. kF32 multiplies f32
// activations by the dequantized weights: the exact oracle. kInt8 quantizes each activation row
// to 8 bits in blocks of 32 and uses integer dot products inside blocks, as llama.cpp does: faster,
// and it reproduces llama.cpp's numbers. Float weights (F32, F16, BF16), Q5_0, Q5_1 and the
// K-quants (Q4_K, Q5_K, Q6_K) always use f32 activations in both (llama.cpp multiplies K-quants
// with Q8_K activations, so int8 nodes serving K-quant files differ from it there).
enum class ActivationPrecision : uint8_t { kF32, kInt8 };

// One product of Backend::MatMulMany: y[n, w->rows] = x * w^T (+ bias).
struct MatMulOut {
  const WeightMatrix* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
};

// One session's part of Backend::AttentionMany, as Backend::Attention's arguments.
struct AttentionCall {
  const float* q = nullptr;
  int64_t n = 0;
  int64_t q_pos0 = 0;
  KvView k, v;
  float* out = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual int threads() const = 0;
  virtual ActivationPrecision activation_precision() const = 0;

  // y[n, w.rows] = x[n, w.cols] * w^T (+ bias[w.rows] when bias != nullptr).
  virtual void MatMul(const float* x, int64_t n, const WeightMatrix& w, const float* bias,
                      float* y) = 0;
  // Several products of the same x (a layer's Q, K and V, or its gate and up): each output the
  // same bits as MatMul's. The CPU runs them in one parallel pass and quantizes x once.
  virtual void MatMulMany(const float* x, int64_t n, std::span<const MatMulOut> outs) {
    for (const MatMulOut& o : outs) MatMul(x, n, *o.w, o.bias, o.y);
  }
  // y[n, d] = x / sqrt(mean(x^2) + eps) * weight[d], row by row. y may alias x.
  virtual void RmsNorm(const float* x, int64_t n, int64_t d, const float* weight, float eps,
                       float* y) = 0;
  // Rotates x[n, heads, head_dim] in place by position positions[i] (inverse: by -position).
  virtual void Rope(float* x, int64_t n, int64_t heads, const int32_t* positions,
                    const RopeParams& p, bool inverse) = 0;
  // out[n, table.cols] = rows ids[i] of table (dequantized). Ids must be < table.rows.
  virtual void Embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) = 0;
  // out[i] = silu(gate[i]) * up[i] for i < n. out may alias gate.
  virtual void SwiGlu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // Causal GQA attention. q[n, n_heads, head_dim]; the query i sits at position q_pos0 + i and
  // attends to keys/values at positions [0, q_pos0 + i]; k and v hold at least q_pos0 + n tokens.
  // Query head h reads KV head h / (n_heads / n_kv_heads). Scale 1/sqrt(head_dim).
  // out[n, n_heads, head_dim].
  virtual void Attention(const float* q, int64_t n, int64_t q_pos0, const KvView& k,
                         const KvView& v, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                         float* out) = 0;
  // Attention for several sessions (each call as Attention's arguments, outputs disjoint): each
  // output the same bits as Attention's. The CPU runs every decode step's queries in one
  // parallel pass.
  virtual void AttentionMany(std::span<const AttentionCall> calls, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim) {
    for (const AttentionCall& c : calls) {
      Attention(c.q, c.n, c.q_pos0, c.k, c.v, n_heads, n_kv_heads, head_dim, c.out);
    }
  }
};

// The CPU kernels need AVX2, FMA and F16C (x86-64-v3). Returns "" when this CPU has them, else
// the names of the missing features, so callers can refuse with a message instead of SIGILL.
std::string MissingCpuFeatures();

// The multi-threaded, batch-invariant CPU backend (kernels/cpu/fixed_order.h). threads <= 0 means
// all hardware threads.
std::unique_ptr<Backend> MakeCpuBackend(int threads,
                                        ActivationPrecision precision = ActivationPrecision::kF32);

}  // namespace riskkv
