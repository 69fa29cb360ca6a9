// The CPU backend: f32 dot products over dequantized weight tiles, integer block dots for 8-bit
// activations, and a fork-join pool across output rows / heads. It is the numerical oracle, and
// it is batch-invariant: every output is computed by the same operations in the same order
// whatever the number of rows in the call, the blocking and the thread count (fixed_order.h), so
// a row's result does not depend on the batch it is computed in.
#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <thread>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "kernels/backend.h"
#include "kernels/cpu/fixed_order.h"
#include "kernels/cpu/panels.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/thread_pool.h"

namespace riskkv {
namespace {

// Batches at most this large unpack each weight row once for all their rows; larger ones
// dequantize a tile of kTileRows weight rows and reuse it across the batch. Both give the same
// bits (cpu::DotDequantizedRow equals cpu::DotF32 of the dequantized row): only speed depends on
// these, never a result.
constexpr int64_t kSmallBatch = 4;
constexpr int64_t kTileRows = 64;
static_assert(kTileRows % cpu::kPanelRows == 0);
// Output rows per claimed chunk for a small batch.
constexpr int64_t kSmallGrain = 32;
// 8-bit products visit the activation rows in blocks of this many, so they stay in cache.
constexpr int64_t kTokenBlock = 64;
// Panel products: runs of at most kMaxPanelGrain panels, about kChunksPerThread per thread.
constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kMaxPanelGrain = 32;
// Queries processed together in attention (bounds the score buffer to kQueryBlock x n_ctx).
constexpr int64_t kQueryBlock = 128;
// Calls with at most this many queries (decode steps) take the per-query attention path.
constexpr int64_t kFewQueries = 4;

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, ActivationPrecision precision)
      : precision_(precision),
        pool_(threads > 0 ? threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {}

  std::string_view name() const override { return "cpu"; }
  int threads() const override { return pool_.threads(); }
  ActivationPrecision activation_precision() const override { return precision_; }

  void MatMul(const float* x, int64_t n, const WeightMatrix& w, const float* bias,
              float* y) override {
    if (precision_ == ActivationPrecision::kInt8 && cpu::HasQ8Products(w.dtype)) {
      MatMulQ8(x, n, w, y);
    } else {
      MatMulF32(x, n, w, y);
    }
    AddBias(n, w, bias, y);
  }

  void MatMulMany(const float* x, int64_t n, std::span<const MatMulOut> outs) override {
    bool panels = precision_ == ActivationPrecision::kInt8;
    for (const MatMulOut& o : outs) {
      panels = panels && o.w->panels != nullptr && cpu::HasQ8Products(o.w->dtype) &&
               o.w->cols == outs.front().w->cols;
    }
    if (!panels || outs.size() < 2) return Backend::MatMulMany(x, n, outs);
    const cpu::Q8Block* xq = QuantizeActivations(x, n, outs.front().w->cols);
    PanelProducts(xq, n, outs);
    for (const MatMulOut& o : outs) AddBias(n, *o.w, o.bias, o.y);
  }

  void RmsNorm(const float* x, int64_t n, int64_t d, const float* weight, float eps,
               float* y) override {
    pool_.ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float* xi = x + i * d;
        float* yi = y + i * d;
        double ss = 0.0;
        for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
        const float scale = static_cast<float>(1.0 / std::sqrt(ss / d + eps));
        for (int64_t j = 0; j < d; ++j) yi[j] = xi[j] * scale * weight[j];
      }
    });
  }

  void Rope(float* x, int64_t n, int64_t heads, const int32_t* positions, const RopeParams& p,
            bool inverse) override {
    const int64_t half = p.rot_dim / 2;
    std::vector<double> inv_freq(half);
    for (int64_t i = 0; i < half; ++i) {
      inv_freq[i] =
          std::pow(p.base, -2.0 * static_cast<double>(i) / static_cast<double>(p.rot_dim));
      if (p.freq_divisors != nullptr) inv_freq[i] /= p.freq_divisors[i];
    }
    const double magnitude = inverse ? 1.0 / p.attn_factor : p.attn_factor;
    pool_.ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> cs(half), sn(half);
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(positions[t]) * inv_freq[i];
          cs[i] = static_cast<float>(magnitude * std::cos(angle));
          sn[i] = static_cast<float>(magnitude * (inverse ? -std::sin(angle) : std::sin(angle)));
        }
        for (int64_t h = 0; h < heads; ++h) {
          float* v = x + (t * heads + h) * p.head_dim;
          for (int64_t i = 0; i < half; ++i) {
            const int64_t a = p.layout == RopeLayout::kInterleaved ? 2 * i : i;
            const int64_t b = p.layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
          }
        }
      }
    });
  }

  void Embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float* out) override {
    for (int64_t i = 0; i < n; ++i) {
      DequantizeRow(table.dtype, table.row(ids[i]), out + i * table.cols, table.cols);
    }
  }

  void AttentionMany(std::span<const AttentionCall> calls, int64_t n_heads, int64_t n_kv_heads,
                     int64_t head_dim) override {
    // Every session's decode queries in one pass; longer calls (prefill chunks, scoring) are
    // parallel within themselves.
    absl::InlinedVector<AttentionCall, 16> few;
    for (const AttentionCall& c : calls) {
      if (c.n <= kFewQueries) {
        few.push_back(c);
      } else {
        Attention(c.q, c.n, c.q_pos0, c.k, c.v, n_heads, n_kv_heads, head_dim, c.out);
      }
    }
    FewQueries(few, n_heads, n_kv_heads, head_dim);
  }

  void SwiGlu(const float* gate, const float* up, int64_t n, float* out) override {
    pool_.ParallelFor(n, 16384, [&](int64_t begin, int64_t end) {
      cpu::SwiGluRow(gate + begin, up + begin, end - begin, out + begin);
    });
  }

  void Attention(const float* q, int64_t n, int64_t q_pos0, const KvView& k, const KvView& v,
                 int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float* out) override {
    const int64_t n_ctx = q_pos0 + n;
    const int64_t group = n_heads / n_kv_heads;
    const int64_t q_stride = n_heads * head_dim;
    const int64_t kv_stride = n_kv_heads * head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    if (n <= kFewQueries) {
      const AttentionCall call{q, n, q_pos0, k, v, out};
      return FewQueries(std::span<const AttentionCall>(&call, 1), n_heads, n_kv_heads, head_dim);
    }
    // Work items: (kv head, query block). All query heads of one KV head share its K/V: read in
    // place from an f32 cache, converted once per head from an f16 one.
    const int64_t n_blocks = (n + kQueryBlock - 1) / kQueryBlock;
    const bool f16 = k.dtype == DType::kF16;
    pool_.ParallelFor(n_kv_heads * n_blocks, 1, [&](int64_t item_begin, int64_t item_end) {
      // Per-thread scratch that only grows: the context grows by one token per decode step,
      // and a re-sized buffer would reallocate every time.
      thread_local std::vector<float> k16, v16, score_buf;
      if (f16) {
        k16.resize(n_ctx * head_dim);
        v16.resize(n_ctx * head_dim);
      }
      score_buf.resize(std::min(kQueryBlock, n) * n_ctx);
      int64_t loaded_head = -1;
      for (int64_t item = item_begin; item < item_end; ++item) {
        const int64_t kvh = item / n_blocks;
        const int64_t blk = item % n_blocks;
        if (f16 && kvh != loaded_head) {
          LoadHead(k, kvh, head_dim, kv_stride, n_ctx, k16.data());
          LoadHead(v, kvh, head_dim, kv_stride, n_ctx, v16.data());
          loaded_head = kvh;
        }
        const float* kh = f16 ? k16.data() : static_cast<const float*>(k.data) + kvh * head_dim;
        const float* vh = f16 ? v16.data() : static_cast<const float*>(v.data) + kvh * head_dim;
        const int64_t kh_stride = f16 ? head_dim : kv_stride;
        const int64_t i0 = blk * kQueryBlock;
        const int64_t nb = std::min(kQueryBlock, n - i0);
        const int64_t ctx = q_pos0 + i0 + nb;  // keys visible to the last query of the block
        float* scores = score_buf.data();
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          // Scores of every query against every key the block sees; a query's row is then
          // normalised over the keys it may attend to, and the rest of the row is never read.
          cpu::DotTile(kh, kh_stride, ctx, q + i0 * q_stride + h * head_dim, q_stride, nb, head_dim,
                       scores, ctx);
          for (int64_t i = 0; i < nb; ++i)
            cpu::Softmax(scores + i * ctx, q_pos0 + i0 + i + 1, scale);
          cpu::WeightedRows(scores, ctx, nb, q_pos0 + i0 + 1, vh, kh_stride, head_dim,
                            out + i0 * q_stride + h * head_dim, q_stride);
        }
      }
    });
  }

 private:
  // Attention for decode steps or a few queries, of one session or several: one query at a
  // time, the query heads of a KV head together, so each cached key and value row is read once
  // per query for all of them (and an f16 one converted as it is read, not into a copy of the
  // whole head). Every score and output is the same sum as the blocked path's, so a row's bits
  // do not depend on which ran, nor on the other sessions of the pass.
  void FewQueries(std::span<const AttentionCall> calls, int64_t n_heads, int64_t n_kv_heads,
                  int64_t head_dim) {
    if (calls.empty()) return;
    const int64_t group = n_heads / n_kv_heads;
    const int64_t q_stride = n_heads * head_dim;
    const int64_t kv_stride = n_kv_heads * head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    // Work items: (call, query, kv head), numbered call by call.
    absl::InlinedVector<int64_t, 17> first(calls.size() + 1, 0);
    int64_t longest = 0;
    for (size_t c = 0; c < calls.size(); ++c) {
      first[c + 1] = first[c] + calls[c].n * n_kv_heads;
      longest = std::max(longest, calls[c].q_pos0 + calls[c].n);
    }
    pool_.ParallelFor(first.back(), 1, [&](int64_t item_begin, int64_t item_end) {
      thread_local std::vector<float> score_buf;  // grows only, as in Attention
      score_buf.resize(group * longest);
      size_t c = 0;
      for (int64_t item = item_begin; item < item_end; ++item) {
        while (item >= first[c + 1]) ++c;
        const AttentionCall& call = calls[c];
        const int64_t i = (item - first[c]) / n_kv_heads;
        const int64_t kvh = (item - first[c]) % n_kv_heads;
        const int64_t visible = call.q_pos0 + i + 1;
        // The group's query heads are adjacent in the query row: they are DotTile's tokens.
        const float* qh = call.q + i * q_stride + kvh * group * head_dim;
        float* oh = call.out + i * q_stride + kvh * group * head_dim;
        float* scores = score_buf.data();
        if (call.k.dtype == DType::kF16) {
          const uint16_t* kh = static_cast<const uint16_t*>(call.k.data) + kvh * head_dim;
          cpu::DotTileF16(kh, kv_stride, visible, qh, head_dim, group, head_dim, scores, visible);
        } else {
          const float* kh = static_cast<const float*>(call.k.data) + kvh * head_dim;
          cpu::DotTile(kh, kv_stride, visible, qh, head_dim, group, head_dim, scores, visible);
        }
        for (int64_t h = 0; h < group; ++h) cpu::Softmax(scores + h * visible, visible, scale);
        if (call.v.dtype == DType::kF16) {
          const uint16_t* vh = static_cast<const uint16_t*>(call.v.data) + kvh * head_dim;
          cpu::WeightedRowsSharedF16(scores, visible, group, visible, vh, kv_stride, head_dim, oh,
                                     head_dim);
        } else {
          const float* vh = static_cast<const float*>(call.v.data) + kvh * head_dim;
          cpu::WeightedRowsShared(scores, visible, group, visible, vh, kv_stride, head_dim, oh,
                                  head_dim);
        }
      }
    });
  }

  // Converts head `h` of an f16 [n_ctx, n_kv_heads, head_dim] cache to dense f32 [n_ctx, head_dim].
  static void LoadHead(const KvView& kv, int64_t h, int64_t head_dim, int64_t stride, int64_t n_ctx,
                       float* dst) {
    for (int64_t t = 0; t < n_ctx; ++t) {
      F16ToF32Row(static_cast<const uint16_t*>(kv.data) + t * stride + h * head_dim,
                  dst + t * head_dim, head_dim);
    }
  }

  static void AddBias(int64_t n, const WeightMatrix& w, const float* bias, float* y) {
    if (bias == nullptr) return;
    for (int64_t i = 0; i < n; ++i) {
      float* row = y + i * w.rows;
      for (int64_t j = 0; j < w.rows; ++j) row[j] += bias[j];
    }
  }

  // Every row of x quantized to 8 bits once, into this thread's buffer (valid until its next
  // call).
  const cpu::Q8Block* QuantizeActivations(const float* x, int64_t n, int64_t cols) {
    const int64_t blocks = cols / 32;
    thread_local std::vector<cpu::Q8Block> xq;
    xq.resize(n * blocks);
    cpu::Q8Block* xq_data = xq.data();
    pool_.ParallelFor(n, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        cpu::QuantizeQ8(x + i * cols, cols, xq_data + i * blocks);
    });
    return xq_data;
  }

  // Rows a thread takes at a time for a small batch: runs of adjacent rows, so each thread reads
  // the weights as one sequential stream the hardware prefetcher follows; about
  // kChunksPerThread runs a thread, so one the OS holds back leaves its share to the others.
  int64_t RowRun(int64_t rows) const {
    return std::max(kSmallGrain, rows / (kChunksPerThread * pool_.threads()));
  }

  // Products over panels (16 weight rows at a time, four tokens at a time; the same bits as the
  // row kernel) of several weights of the same width, in one parallel pass over all their
  // panels.
  void PanelProducts(const cpu::Q8Block* xq, int64_t n, std::span<const MatMulOut> outs) {
    const int64_t cols = outs.front().w->cols, blocks = cols / 32;
    absl::InlinedVector<int64_t, 4> first(outs.size() + 1, 0);  // each weight's first panel
    for (size_t j = 0; j < outs.size(); ++j) {
      first[j + 1] = first[j] + outs[j].w->rows / cpu::kPanelRows;
    }
    // Runs of adjacent panels, so each thread reads the weights as one sequential stream the
    // hardware prefetcher follows; about kChunksPerThread runs a thread, so one the OS holds back
    // leaves its share to the others.
    const int64_t grain =
        std::clamp<int64_t>(first.back() / (kChunksPerThread * pool_.threads()), 1, kMaxPanelGrain);
    pool_.ParallelFor(first.back(), grain, [&](int64_t begin, int64_t end) {
      for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
        const int64_t t1 = std::min(n, t0 + kTokenBlock);
        size_t j = 0;
        for (int64_t p = begin; p < end; ++p) {
          while (p >= first[j + 1]) ++j;
          const WeightMatrix& w = *outs[j].w;
          const int64_t panel = p - first[j];
          for (int64_t i = t0; i < t1; i += 4) {
            cpu::DotPanelQ8(w.dtype, w.panels + panel * cpu::PanelBytes(w.dtype, cols),
                            xq + i * blocks, blocks, static_cast<int>(std::min<int64_t>(4, t1 - i)),
                            cols, outs[j].y + i * w.rows + panel * cpu::kPanelRows, w.rows);
          }
        }
      }
    });
  }

  // 8-bit activations: quantize every row of x once, then integer block dots. Rows of w are
  // claimed in chunks and tokens visited in blocks so both stay in cache.
  void MatMulQ8(const float* x, int64_t n, const WeightMatrix& w, float* y) {
    const int64_t blocks = w.cols / 32;
    const cpu::Q8Block* xq_data = QuantizeActivations(x, n, w.cols);
    if (w.panels != nullptr) {
      const MatMulOut out{&w, nullptr, y};
      return PanelProducts(xq_data, n, std::span<const MatMulOut>(&out, 1));
    }
    const int64_t row_bytes = RowBytes(w.dtype, w.cols);
    pool_.ParallelFor(
        w.rows, n <= kSmallBatch ? RowRun(w.rows) : 16, [&](int64_t begin, int64_t end) {
          for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
            const int64_t t1 = std::min(n, t0 + kTokenBlock);
            for (int64_t r = begin; r < end; r += cpu::kDotRowsQ8) {
              const int n_rows = static_cast<int>(std::min<int64_t>(cpu::kDotRowsQ8, end - r));
              for (int64_t i = t0; i < t1; i += 4) {
                const int count = static_cast<int>(std::min<int64_t>(4, t1 - i));
                float out[cpu::kDotRowsQ8 * 4];
                cpu::DotRowsQ8(w.dtype, w.row(r), row_bytes, n_rows, xq_data + i * blocks, blocks,
                               count, w.cols, out);
                for (int k = 0; k < n_rows; ++k) {
                  for (int j = 0; j < count; ++j) y[(i + j) * w.rows + r + k] = out[k * count + j];
                }
              }
            }
          }
        });
  }

  // f32 activations: weight rows as f32 (in place for F32 weights, else dequantized a tile at a
  // time), each output one cpu::DotF32 of a weight row and an activation row.
  void MatMulF32(const float* x, int64_t n, const WeightMatrix& w, float* y) {
    const bool panels = w.panels != nullptr && !cpu::HasQ8Products(w.dtype);
    if (n <= kSmallBatch && panels) {
      // F16 / BF16 panels: 16 rows a panel, read as one stream.
      const int64_t bytes = cpu::PanelBytes(w.dtype, w.cols);
      pool_.ParallelFor(w.rows / cpu::kPanelRows, RowRun(w.rows) / cpu::kPanelRows,
                        [&](int64_t begin, int64_t end) {
                          for (int64_t p = begin; p < end; ++p) {
                            cpu::DotPanelF32(w.dtype, w.panels + p * bytes, x, w.cols,
                                             static_cast<int>(n), w.cols, y + p * cpu::kPanelRows,
                                             w.rows);
                          }
                        });
      return;
    }
    if (n <= kSmallBatch) {
      // A few rows: each weight row unpacked once for all of them, never expanded in memory;
      // runs of adjacent rows, as PanelProducts takes its panels.
      pool_.ParallelFor(w.rows, RowRun(w.rows), [&](int64_t begin, int64_t end) {
        cpu::DotDequantizedRows(w.dtype, w.row(begin), RowBytes(w.dtype, w.cols), end - begin, x,
                                w.cols, static_cast<int>(n), w.cols, y + begin, w.rows);
      });
      return;
    }
    const int64_t n_tiles = (w.rows + kTileRows - 1) / kTileRows;
    pool_.ParallelFor(n_tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
      thread_local std::vector<float> tile_buf;  // grows only (cols alternate hidden / FFN)
      for (int64_t t = tile_begin; t < tile_end; ++t) {
        const int64_t r0 = t * kTileRows;
        const int64_t nr = std::min(kTileRows, w.rows - r0);
        const float* tile = reinterpret_cast<const float*>(w.row(r0));
        if (w.dtype != DType::kF32) {
          tile_buf.resize(kTileRows * w.cols);
          if (panels) {  // kTileRows is a whole number of panels
            for (int64_t r = 0; r < nr; r += cpu::kPanelRows) {
              cpu::PanelRowsF32(
                  w.dtype, w.panels + (r0 + r) / cpu::kPanelRows * cpu::PanelBytes(w.dtype, w.cols),
                  w.cols, tile_buf.data() + r * w.cols);
            }
          } else {
            for (int64_t r = 0; r < nr; ++r) {
              DequantizeRow(w.dtype, w.row(r0 + r), tile_buf.data() + r * w.cols, w.cols);
            }
          }
          tile = tile_buf.data();
        }
        if (cpu::PairTileSupported() && nr % 2 == 0 && w.cols % 8 == 0) {
          thread_local std::vector<float> pair_buf;  // grows only, as tile_buf
          pair_buf.resize(kTileRows * w.cols);
          cpu::InterleavePairs(tile, nr, w.cols, pair_buf.data());
          cpu::DotPairTile(pair_buf.data(), nr, x, w.cols, n, w.cols, y + r0, w.rows);
        } else {
          cpu::DotTile(tile, w.cols, nr, x, w.cols, n, w.cols, y + r0, w.rows);
        }
      }
    });
  }

  ActivationPrecision precision_;
  cpu::ThreadPool pool_;
};

}  // namespace

std::string MissingCpuFeatures() {
  std::string missing;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) missing += " avx2";
  if (!__builtin_cpu_supports("fma")) missing += " fma";
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  // The 8-bit block dots use VNNI where the build targets it (cpu/quant_dot.cc).
  if (!__builtin_cpu_supports("avx512vnni")) missing += " avx512vnni";
  if (!__builtin_cpu_supports("avx512vl")) missing += " avx512vl";
#elif defined(__AVXVNNI__)
  if (!__builtin_cpu_supports("avxvnni")) missing += " avxvnni";
#endif
  // F16C has no __builtin_cpu_supports name in gcc 12; every AVX2 x86 CPU shipped has it.
  return missing.empty() ? missing : missing.substr(1);
}

std::unique_ptr<Backend> MakeCpuBackend(int threads, ActivationPrecision precision) {
  return std::make_unique<CpuBackend>(threads, precision);
}

}  // namespace riskkv
