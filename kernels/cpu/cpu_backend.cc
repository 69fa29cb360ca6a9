// The CPU backend: Eigen GEMMs over dequantized weight tiles for batches, fused quantized dot
// products for single rows, and a fork-join pool across output rows / heads. It is the
// numerical oracle.
#define EIGEN_DONT_PARALLELIZE  // parallelism comes from the pool around Eigen calls

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/quant_dot.h"
#include "kernels/cpu/thread_pool.h"

namespace riskkv {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
using Map = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;

// Batches at most this large use the fused per-row dot products; larger ones dequantize a tile
// of weight rows and run a GEMM, which amortises the dequantization over the batch.
constexpr int64_t kMaxFusedBatch = 4;
constexpr int64_t kTileRows = 64;
// Output rows per claimed chunk on the fused path.
constexpr int64_t kFusedGrain = 32;
// Queries processed together in attention (bounds the score buffer to kQueryBlock x n_ctx).
constexpr int64_t kQueryBlock = 128;

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
    if (precision_ == ActivationPrecision::kInt8 &&
        (w.dtype == DType::kQ4_0 || w.dtype == DType::kQ4_1 || w.dtype == DType::kQ8_0)) {
      MatMulQ8(x, n, w, y);
    } else if (n <= kMaxFusedBatch) {
      MatMulFused(x, n, w, y);
    } else {
      MatMulTiled(x, n, w, y);
    }
    if (bias != nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        float* row = y + i * w.rows;
        for (int64_t j = 0; j < w.rows; ++j) row[j] += bias[j];
      }
    }
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
    }
    pool_.ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> cs(half), sn(half);
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const double angle = static_cast<double>(positions[t]) * inv_freq[i];
          cs[i] = static_cast<float>(std::cos(angle));
          sn[i] = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
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

  void SwiGlu(const float* gate, const float* up, int64_t n, float* out) override {
    pool_.ParallelFor(n, 16384, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
      }
    });
  }

  void Attention(const float* q, int64_t n, int64_t q_pos0, const KvView& k, const KvView& v,
                 int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float* out) override {
    const int64_t n_ctx = q_pos0 + n;
    const int64_t group = n_heads / n_kv_heads;
    const int64_t q_stride = n_heads * head_dim;
    const int64_t kv_stride = n_kv_heads * head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    // Work items: (kv head, query block). All query heads of one KV head share its K/V: read in
    // place from an f32 cache, converted once per head from an f16 one.
    const int64_t n_blocks = (n + kQueryBlock - 1) / kQueryBlock;
    const bool f16 = k.dtype == DType::kF16;
    pool_.ParallelFor(n_kv_heads * n_blocks, 1, [&](int64_t item_begin, int64_t item_end) {
      // Per-thread scratch that only grows: the context grows by one token per decode step,
      // and a re-sized Eigen matrix would reallocate every time.
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
        const ConstMap kh =
            f16 ? ConstMap(k16.data(), n_ctx, head_dim, Eigen::OuterStride<>(head_dim))
                : ConstMap(static_cast<const float*>(k.data) + kvh * head_dim, n_ctx, head_dim,
                           Eigen::OuterStride<>(kv_stride));
        const ConstMap vh =
            f16 ? ConstMap(v16.data(), n_ctx, head_dim, Eigen::OuterStride<>(head_dim))
                : ConstMap(static_cast<const float*>(v.data) + kvh * head_dim, n_ctx, head_dim,
                           Eigen::OuterStride<>(kv_stride));
        const int64_t i0 = blk * kQueryBlock;
        const int64_t nb = std::min(kQueryBlock, n - i0);
        const int64_t ctx = q_pos0 + i0 + nb;  // keys visible to the last query of the block
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          ConstMap qh(q + i0 * q_stride + h * head_dim, nb, head_dim,
                      Eigen::OuterStride<>(q_stride));
          Map scores(score_buf.data(), nb, ctx, Eigen::OuterStride<>(ctx));
          scores.noalias() = (qh * kh.topRows(ctx).transpose()) * scale;
          for (int64_t i = 0; i < nb; ++i) {
            const int64_t visible = q_pos0 + i0 + i + 1;
            float* s = scores.row(i).data();
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < visible; ++j) mx = std::max(mx, s[j]);
            float sum = 0.0f;
            for (int64_t j = 0; j < visible; ++j) {
              s[j] = std::exp(s[j] - mx);
              sum += s[j];
            }
            const float inv = 1.0f / sum;
            for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
            for (int64_t j = visible; j < ctx; ++j) s[j] = 0.0f;
          }
          Map oh(out + i0 * q_stride + h * head_dim, nb, head_dim, Eigen::OuterStride<>(q_stride));
          oh.noalias() = scores * vh.topRows(ctx);
        }
      }
    });
  }

 private:
  // Converts head `h` of an f16 [n_ctx, n_kv_heads, head_dim] cache to dense f32 [n_ctx, head_dim].
  static void LoadHead(const KvView& kv, int64_t h, int64_t head_dim, int64_t stride, int64_t n_ctx,
                       float* dst) {
    for (int64_t t = 0; t < n_ctx; ++t) {
      F16ToF32Row(static_cast<const uint16_t*>(kv.data) + t * stride + h * head_dim,
                  dst + t * head_dim, head_dim);
    }
  }

  void MatMulFused(const float* x, int64_t n, const WeightMatrix& w, float* y) {
    std::vector<float> sums(n * (w.cols / 32));
    if (w.dtype == DType::kQ4_1) {
      for (int64_t i = 0; i < n; ++i)
        cpu::BlockSums(x + i * w.cols, w.cols, sums.data() + i * (w.cols / 32));
    }
    pool_.ParallelFor(w.rows, kFusedGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const uint8_t* row = w.row(r);
        for (int64_t i = 0; i < n; ++i) {
          y[i * w.rows + r] =
              cpu::DotRow(w.dtype, row, x + i * w.cols, sums.data() + i * (w.cols / 32), w.cols);
        }
      }
    });
  }

  // 8-bit activations: quantize every row of x once, then integer block dots. Rows of w are
  // claimed in chunks and tokens visited in blocks so both stay in cache.
  void MatMulQ8(const float* x, int64_t n, const WeightMatrix& w, float* y) {
    const int64_t blocks = w.cols / 32;
    thread_local std::vector<cpu::Q8Block> xq;
    xq.resize(n * blocks);
    cpu::Q8Block* xq_data = xq.data();
    pool_.ParallelFor(n, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        cpu::QuantizeQ8(x + i * w.cols, w.cols, xq_data + i * blocks);
    });
    constexpr int64_t kTokenBlock = 64;
    pool_.ParallelFor(
        w.rows, n <= kMaxFusedBatch ? kFusedGrain : 16, [&](int64_t begin, int64_t end) {
          for (int64_t t0 = 0; t0 < n; t0 += kTokenBlock) {
            const int64_t t1 = std::min(n, t0 + kTokenBlock);
            for (int64_t r = begin; r < end; ++r) {
              const uint8_t* row = w.row(r);
              for (int64_t i = t0; i < t1; i += 4) {
                const int count = static_cast<int>(std::min<int64_t>(4, t1 - i));
                float out[4];
                cpu::DotRowQ8(w.dtype, row, xq_data + i * blocks, blocks, count, w.cols, out);
                for (int j = 0; j < count; ++j) y[(i + j) * w.rows + r] = out[j];
              }
            }
          }
        });
  }

  void MatMulTiled(const float* x, int64_t n, const WeightMatrix& w, float* y) {
    const int64_t n_tiles = (w.rows + kTileRows - 1) / kTileRows;
    ConstMap xm(x, n, w.cols, Eigen::OuterStride<>(w.cols));
    pool_.ParallelFor(n_tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
      thread_local std::vector<float> tile_buf;  // grows only (cols alternate hidden / FFN)
      tile_buf.resize(kTileRows * w.cols);
      Map tile(tile_buf.data(), kTileRows, w.cols, Eigen::OuterStride<>(w.cols));
      for (int64_t t = tile_begin; t < tile_end; ++t) {
        const int64_t r0 = t * kTileRows;
        const int64_t nr = std::min(kTileRows, w.rows - r0);
        for (int64_t r = 0; r < nr; ++r) {
          DequantizeRow(w.dtype, w.row(r0 + r), tile.row(r).data(), w.cols);
        }
        Map ym(y + r0, n, nr, Eigen::OuterStride<>(w.rows));
        ym.noalias() = xm * tile.topRows(nr).transpose();
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
  // F16C has no __builtin_cpu_supports name in gcc 12; every AVX2 x86 CPU shipped has it.
  return missing.empty() ? missing : missing.substr(1);
}

std::unique_ptr<Backend> MakeCpuBackend(int threads, ActivationPrecision precision) {
  return std::make_unique<CpuBackend>(threads, precision);
}

}  // namespace riskkv
