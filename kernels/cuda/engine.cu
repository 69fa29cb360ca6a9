// The GPU engine: f16 weights, cuBLAS GEMMs with f32 accumulation, forward passes over one or
// more sessions in micro-batches on one compute stream, per-session f16 KV caches, KV uploads
// through pinned staging buffers on a transfer stream, and RISK-KV rebuilds as one GEMM per group.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/batch_plan.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/engine_api.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/module_abi.h"

namespace riskkv::cuda {
namespace {

// Tokens per forward micro-batch: bounds activations and the attention scores
// ([n_heads, kMicroBatch, context] f32) while keeping prefill GEMMs large.
constexpr int64_t kMicroBatch = 1024;
// Rows per lm-head GEMM when every position's logits are wanted: bounds the logits buffer.
constexpr int64_t kLogitRows = 64;
// Pinned staging: slots of this many bytes, reused round-robin behind an event each.
constexpr int kStagingSlots = 8;
constexpr size_t kStagingSlotBytes = 1 << 20;
constexpr int64_t kMaxInt = 0x7fffffff;

cublasOperation_t Op(bool transpose) { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }
// cuBLAS takes int sizes; the engine bounds every dimension below 2^31 (capacity, widths).
int I(int64_t v) { return static_cast<int>(v); }

// Attention scores ([heads, query rows, context] f32 plus f16 probabilities) are bounded by
// processing the queries of one call in chunks of at most this many bytes of scratch.
constexpr size_t kAttentionScratchBytes = size_t{512} << 20;

// GEMMs and attention on one stream, shared by the engine and the single-op entry points.
class Compute {
 public:
  int Init() {
    RKV_CUDA(stream_.Create());
    RKV_BLAS(blas_.Create());
    RKV_BLAS(cublasSetStream(blas_.get(), stream_.get()));
    return 0;
  }
  cudaStream_t stream() const { return stream_.get(); }
  cublasHandle_t blas() const { return blas_.get(); }

  // y[n, rows] (rows ldy apart) = beta * y + x[n, cols] (f16, ldx apart) * w[rows, cols]^T.
  int Linear(const __half* x, int64_t ldx, int64_t n, const __half* w, int64_t rows, int64_t cols,
             float* y, int64_t ldy, float beta) {
    const float alpha = 1.0f;
    const GemmPlan p = LinearPlan(n, rows, cols, ldx, ldy);
    RKV_BLAS(cublasGemmEx(blas_.get(), Op(p.trans_a), Op(p.trans_b), I(p.m), I(p.n), I(p.k), &alpha,
                          w, CUDA_R_16F, I(p.lda), x, CUDA_R_16F, I(p.ldb), &beta, y, CUDA_R_32F,
                          I(p.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return 0;
  }

  // As Attention, from f32 queries: a single query (decoding) runs the fused decode kernel on
  // them directly; more are converted into q_half (n * ldq halfs) for the GEMM path.
  int AttentionF32(const float* q, int64_t ldq, int64_t n, int64_t q_pos0, const __half* k,
                   const __half* v, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                   float* out, __half* q_half) {
    if (n == 1 && DecodeAttentionFits(q_pos0 + 1, head_dim)) {
      RKV_CUDA(LaunchDecodeAttention(q, k, v, q_pos0 + 1, n_heads, n_kv_heads, head_dim, out,
                                     stream_.get()));
      return 0;
    }
    RKV_CUDA(LaunchToHalf(q, n * ldq, q_half, stream_.get()));
    return Attention(q_half, ldq, n, q_pos0, k, v, n_heads, n_kv_heads, head_dim, out);
  }

  // Causal GQA attention of q[n, n_heads, head_dim] (f16, rows ldq apart) at positions
  // [q_pos0, q_pos0 + n) over k/v [ctx = q_pos0 + n, n_kv_heads, head_dim] f16, into
  // out[n, n_heads * head_dim] f32, in chunks of queries that keep the scratch bounded.
  int Attention(const __half* q, int64_t ldq, int64_t n, int64_t q_pos0, const __half* k,
                const __half* v, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                float* out) {
    const int64_t ctx = q_pos0 + n;
    const int64_t per_row = n_heads * ctx * static_cast<int64_t>(sizeof(float) + sizeof(__half));
    const int64_t rows = std::max<int64_t>(
        1, std::min<int64_t>(n, static_cast<int64_t>(kAttentionScratchBytes) / per_row));
    for (int64_t i0 = 0; i0 < n; i0 += rows) {
      const int64_t m = std::min(rows, n - i0);
      RKV_TRY(AttentionChunk(q + i0 * ldq, ldq, m, q_pos0 + i0, k, v, n_heads, n_kv_heads, head_dim,
                             out + i0 * n_heads * head_dim));
    }
    return 0;
  }

 private:
  // One chunk: per KV head, one strided-batched GEMM for the scores of its query heads, a causal
  // softmax, one strided-batched GEMM for the weighted values.
  int AttentionChunk(const __half* q, int64_t ldq, int64_t n, int64_t q_pos0, const __half* k,
                     const __half* v, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                     float* out) {
    const int64_t ctx = q_pos0 + n;
    const int64_t per_head = n * ctx;
    RKV_CUDA(scores_.Reserve(n_heads * per_head));
    RKV_CUDA(probs_.Reserve(n_heads * per_head));
    const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
    const float one = 1.0f, zero = 0.0f;
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      const GemmPlan p = ScoresPlan(g, n, ctx, ldq, n_heads, n_kv_heads, head_dim);
      RKV_BLAS(cublasGemmStridedBatchedEx(
          blas_.get(), Op(p.trans_a), Op(p.trans_b), I(p.m), I(p.n), I(p.k), &scale, k + p.offset_a,
          CUDA_R_16F, I(p.lda), p.stride_a, q + p.offset_b, CUDA_R_16F, I(p.ldb), p.stride_b, &zero,
          scores_.get() + p.offset_c, CUDA_R_32F, I(p.ldc), p.stride_c, I(p.batch),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    RKV_CUDA(
        LaunchCausalSoftmax(scores_.get(), n_heads, n, ctx, q_pos0, probs_.get(), stream_.get()));
    for (int64_t g = 0; g < n_kv_heads; ++g) {
      const GemmPlan p = ValuesPlan(g, n, ctx, n_heads, n_kv_heads, head_dim);
      RKV_BLAS(cublasGemmStridedBatchedEx(
          blas_.get(), Op(p.trans_a), Op(p.trans_b), I(p.m), I(p.n), I(p.k), &one, v + p.offset_a,
          CUDA_R_16F, I(p.lda), p.stride_a, probs_.get() + p.offset_b, CUDA_R_16F, I(p.ldb),
          p.stride_b, &zero, out + p.offset_c, CUDA_R_32F, I(p.ldc), p.stride_c, I(p.batch),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    return 0;
  }

  Stream stream_;
  BlasHandle blas_;
  DeviceArray<float> scores_;
  DeviceArray<__half> probs_;
};

// Makes `device` current for the calling thread (CUDA's current device is per thread, and gRPC
// calls arrive on any thread) and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() {
    int now = previous_;
    cudaGetDevice(&now);
    if (now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class EngineImpl;

class PredictorsImpl final : public Predictors {
 public:
  const void* engine = nullptr;  // the engine whose sessions these fit
  struct Group {
    std::vector<int32_t> anchors, targets;
    int64_t features = 0;     // F
    DeviceArray<float> a, c;  // [T * 2 * kv_width, F], [T * 2 * kv_width]
  };
  std::vector<Group> groups;
};

class SessionImpl final : public Session {
 public:
  SessionImpl(EngineImpl& engine, int64_t capacity) : engine_(engine), capacity_(capacity) {}
  ~SessionImpl() override;
  int Init();
  const char* error() const override { return LastError().c_str(); }
  int64_t n_tokens() const override { return n_tokens_; }
  int64_t capacity() const override { return capacity_; }
  int SetTokens(int64_t n) override {
    if (n < 0 || n > capacity_) {
      return Fail(
          __FILE__, __LINE__,
          "SetTokens(" + std::to_string(n) + ") outside [0, " + std::to_string(capacity_) + "]");
    }
    n_tokens_ = n;
    return 0;
  }
  int Forward(const int32_t* tokens, int64_t n, int all_logits, float* logits) override;
  int UploadRows(int32_t layer, int values, int64_t first, int64_t count,
                 const uint16_t* src) override;
  int MarkLayerUploaded(int32_t layer) override;
  int Rebuild(const Predictors* p, int group, int64_t begin, int64_t count) override;
  int DownloadRows(int32_t layer, int values, int64_t first, int64_t count, uint16_t* dst) override;
  int WaitRebuilds() override;
  int Synchronize() override;

  __half* rows(int32_t layer, int values) const;
  const EngineImpl* owner() const { return &engine_; }
  // Makes the compute stream wait for every upload enqueued so far.
  int WaitTransfers(cudaStream_t compute);
  // Records on the compute stream that work reading or writing `layer` has been queued, so a
  // later upload into that layer waits for it.
  int MarkComputeUse(int32_t layer, cudaStream_t compute);

 private:
  int CheckRows(int32_t layer, int values, int64_t first, int64_t count);
  EngineImpl& engine_;
  const int64_t capacity_;
  int64_t n_tokens_ = 0;
  DeviceArray<__half> kv_;  // [n_layers][2][capacity][kv_width]
  Stream transfer_;
  Event transfers_done_;
  std::vector<Event> layer_ready_;  // on the transfer stream: uploads marked per layer
  std::vector<Event> layer_used_;   // on the compute stream: the last work touching a layer
  Event rebuilt_;                   // on the compute stream, after the last queued rebuild
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(int device, const ModelDims& dims) : device_(device), dims_(dims) {}

  int Init() {
    DeviceScope scope(device_);
    const ModelDims& d = dims_;
    if (d.n_layers < 1 || d.hidden < 1 || d.n_heads < 1 || d.n_kv_heads < 1 ||
        d.n_heads % d.n_kv_heads != 0 || d.head_dim < 2 || d.ffn < 1 || d.vocab < 1 ||
        d.rope_dim < 2 || d.rope_dim > d.head_dim || d.rope_dim % 2 != 0 || d.vocab > kMaxInt ||
        d.n_heads * d.head_dim * d.hidden > kMaxInt ||
        (d.rope_scaled && (d.rope_dim / 2 > kMaxRopePairs || !(d.rope_attn_factor > 0)))) {
      return Fail(__FILE__, __LINE__, "model dimensions are not a valid decoder");
    }
    q_width_ = d.n_heads * d.head_dim;
    kv_width_ = d.n_kv_heads * d.head_dim;
    qkv_width_ = q_width_ + 2 * kv_width_;
    RKV_TRY(compute_.Init());
    layers_.resize(d.n_layers);
    for (Layer& l : layers_) {
      RKV_CUDA(l.wqkv.Allocate(qkv_width_ * d.hidden));
      RKV_CUDA(l.w_gate_up.Allocate(2 * d.ffn * d.hidden));
      if (d.qkv_bias) RKV_CUDA(l.bqkv.Allocate(qkv_width_));
    }
    for (int i = 0; i < kStagingSlots; ++i) {
      RKV_CUDA(staging_[i].Allocate(kStagingSlotBytes));
      RKV_CUDA(staging_done_[i].Create());
    }
    RKV_CUDA(x_.Allocate(kMicroBatch * d.hidden));
    RKV_CUDA(xh_.Allocate(kMicroBatch * std::max({d.hidden, q_width_, d.ffn})));
    RKV_CUDA(qkv_.Allocate(kMicroBatch * qkv_width_));
    RKV_CUDA(qkvh_.Allocate(kMicroBatch * qkv_width_));
    RKV_CUDA(attn_.Allocate(kMicroBatch * q_width_));
    RKV_CUDA(gate_up_.Allocate(kMicroBatch * 2 * d.ffn));
    RKV_CUDA(ints_.Allocate(3 * kMicroBatch));
    RKV_CUDA(logits_.Allocate(kLogitRows * d.vocab));
    return 0;
  }

  const char* error() const override { return LastError().c_str(); }
  const ModelDims& dims() const override { return dims_; }

  int SetMatrix(int32_t layer, int slot, const uint16_t* data, int64_t rows,
                int64_t cols) override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(mu_);
    const ModelDims& d = dims_;
    __half* dst = nullptr;
    int64_t want_rows = 0, want_cols = d.hidden;
    if (layer == -1 && (slot == kTokenEmbedding || slot == kLmHead)) {
      DeviceArray<__half>& m = slot == kTokenEmbedding ? embedding_ : lm_head_;
      if (rows != d.vocab || cols != d.hidden) return BadShape(layer, slot, rows, cols);
      RKV_CUDA(m.Allocate(rows * cols));
      dst = m.get();
      want_rows = d.vocab;
    } else if (layer >= 0 && layer < d.n_layers) {
      Layer& l = layers_[layer];
      switch (slot) {
        case kWq:
          dst = l.wqkv.get();
          want_rows = q_width_;
          break;
        case kWk:
          dst = l.wqkv.get() + q_width_ * d.hidden;
          want_rows = kv_width_;
          break;
        case kWv:
          dst = l.wqkv.get() + (q_width_ + kv_width_) * d.hidden;
          want_rows = kv_width_;
          break;
        case kWo:
          RKV_CUDA(l.wo.Allocate(d.hidden * q_width_));
          dst = l.wo.get();
          want_rows = d.hidden;
          want_cols = q_width_;
          break;
        case kWGate:
          dst = l.w_gate_up.get();
          want_rows = d.ffn;
          break;
        case kWUp:
          dst = l.w_gate_up.get() + d.ffn * d.hidden;
          want_rows = d.ffn;
          break;
        case kWDown:
          RKV_CUDA(l.w_down.Allocate(d.hidden * d.ffn));
          dst = l.w_down.get();
          want_rows = d.hidden;
          want_cols = d.ffn;
          break;
        default:
          return BadShape(layer, slot, rows, cols);
      }
    }
    if (dst == nullptr || rows != want_rows || cols != want_cols) {
      return BadShape(layer, slot, rows, cols);
    }
    // On the compute stream, so kernels queued later see the weights; a pageable source is
    // staged by the driver before this returns.
    RKV_CUDA(cudaMemcpyAsync(dst, data, rows * cols * sizeof(__half), cudaMemcpyHostToDevice,
                             compute_.stream()));
    if (layer >= 0) layers_[layer].set |= 1u << slot;
    return 0;
  }

  int SetVector(int32_t layer, int slot, const float* data, int64_t n) override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(mu_);
    const ModelDims& d = dims_;
    float* dst = nullptr;
    int64_t want = d.hidden;
    if (layer == -1 && slot == kOutputNorm) {
      RKV_CUDA(output_norm_.Allocate(d.hidden));
      dst = output_norm_.get();
    } else if (layer >= 0 && layer < d.n_layers) {
      Layer& l = layers_[layer];
      switch (slot) {
        case kAttnNorm:
          RKV_CUDA(l.attn_norm.Allocate(d.hidden));
          dst = l.attn_norm.get();
          break;
        case kFfnNorm:
          RKV_CUDA(l.ffn_norm.Allocate(d.hidden));
          dst = l.ffn_norm.get();
          break;
        case kBq:
          if (d.qkv_bias) dst = l.bqkv.get(), want = q_width_;
          break;
        case kBk:
          if (d.qkv_bias) dst = l.bqkv.get() + q_width_, want = kv_width_;
          break;
        case kBv:
          if (d.qkv_bias) dst = l.bqkv.get() + q_width_ + kv_width_, want = kv_width_;
          break;
        default:
          break;
      }
    }
    if (dst == nullptr || n != want) return BadShape(layer, slot, 1, n);
    RKV_CUDA(
        cudaMemcpyAsync(dst, data, n * sizeof(float), cudaMemcpyHostToDevice, compute_.stream()));
    if (layer >= 0) layers_[layer].set |= 1u << slot;
    return 0;
  }

  int Finalize() override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(mu_);
    RKV_CUDA(cudaStreamSynchronize(compute_.stream()));
    const ModelDims& d = dims_;
    uint32_t need = (1u << kWq) | (1u << kWk) | (1u << kWv) | (1u << kWo) | (1u << kWGate) |
                    (1u << kWUp) | (1u << kWDown) | (1u << kAttnNorm) | (1u << kFfnNorm);
    if (d.qkv_bias) need |= (1u << kBq) | (1u << kBk) | (1u << kBv);
    for (int64_t l = 0; l < d.n_layers; ++l) {
      if ((layers_[l].set & need) != need) {
        return Fail(__FILE__, __LINE__, "layer " + std::to_string(l) + " misses weights");
      }
    }
    if (embedding_.get() == nullptr || output_norm_.get() == nullptr ||
        (!d.tied && lm_head_.get() == nullptr)) {
      return Fail(__FILE__, __LINE__, "embedding, output norm or lm head missing");
    }
    return 0;
  }

  int64_t device_bytes() const override {
    int64_t b = embedding_.bytes() + lm_head_.bytes() + output_norm_.bytes();
    for (const Layer& l : layers_) {
      b += l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes() +
           l.attn_norm.bytes() + l.ffn_norm.bytes() + l.bqkv.bytes();
    }
    return b;
  }

  int ForwardMany(const ForwardItem* items, int64_t count) override;

  Session* NewSession(int64_t capacity) override {
    DeviceScope scope(device_);
    if (capacity < 1 || capacity > kMaxInt) {
      Fail(__FILE__, __LINE__, "session capacity must be in [1, 2^31)");
      return nullptr;
    }
    auto s = std::make_unique<SessionImpl>(*this, capacity);
    if (s->Init() != 0) {
      Fail(__FILE__, __LINE__, std::string("session: ") + s->error());
      return nullptr;
    }
    return s.release();
  }

  Predictors* NewPredictors(int n_groups, const int32_t* n_anchors, const int32_t* anchors,
                            const int32_t* n_targets, const int32_t* targets, const float* const* a,
                            const float* const* c) override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(mu_);
    auto p = std::make_unique<PredictorsImpl>();
    p->engine = this;
    p->groups.resize(n_groups);
    for (int g = 0; g < n_groups; ++g) {
      PredictorsImpl::Group& grp = p->groups[g];
      if (n_anchors[g] < 1 || n_anchors[g] > kMaxGroupLayers || n_targets[g] < 1 ||
          n_targets[g] > kMaxGroupLayers) {
        Fail(__FILE__, __LINE__,
             "group " + std::to_string(g) + " has " + std::to_string(n_anchors[g]) +
                 " anchors and " + std::to_string(n_targets[g]) + " targets (1.." +
                 std::to_string(kMaxGroupLayers) + " each)");
        return nullptr;
      }
      grp.anchors.assign(anchors, anchors + n_anchors[g]);
      grp.targets.assign(targets, targets + n_targets[g]);
      anchors += n_anchors[g];
      targets += n_targets[g];
      for (int32_t l : grp.anchors) {
        if (l < 0 || l >= dims_.n_layers) return BadLayer(l);
      }
      for (int32_t l : grp.targets) {
        if (l < 0 || l >= dims_.n_layers) return BadLayer(l);
      }
      grp.features = 2 * n_anchors[g] * kv_width_;
      const int64_t out = 2 * n_targets[g] * kv_width_;
      if (Upload(grp.a, a[g], out * grp.features) != 0 || Upload(grp.c, c[g], out) != 0) {
        return nullptr;
      }
    }
    // The host arrays may go once the copies are done.
    if (const cudaError_t e = cudaStreamSynchronize(compute_.stream()); e != cudaSuccess) {
      Fail(__FILE__, __LINE__, CudaMessage("cudaStreamSynchronize", e));
      return nullptr;
    }
    return p.release();
  }

  int PinHostMemory(void* p, int64_t bytes) override {
    DeviceScope scope(device_);
    if (bytes < 1) return Fail(__FILE__, __LINE__, "nothing to page-lock");
    const cudaError_t e = cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: the thread's next launch must not report it
      return Fail(__FILE__, __LINE__, CudaMessage("cudaHostRegister", e));
    }
    return 0;
  }
  int UnpinHostMemory(void* p) override {
    DeviceScope scope(device_);
    const cudaError_t e = cudaHostUnregister(p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return Fail(__FILE__, __LINE__, CudaMessage("cudaHostUnregister", e));
    }
    return 0;
  }

  double TimeGemm(int64_t m, int64_t n, int64_t k, int repeats) override {
    DeviceScope scope(device_);
    std::lock_guard<std::mutex> lock(mu_);
    if (m < 1 || n < 1 || k < 1 || m > kMaxInt || n > kMaxInt || k > kMaxInt) {
      Fail(__FILE__, __LINE__, "GEMM dimensions out of range");
      return -1.0;
    }
    DeviceArray<__half> a, b;
    DeviceArray<float> c;
    Event start, stop;
    if (a.Allocate(m * k) != cudaSuccess || b.Allocate(k * n) != cudaSuccess ||
        c.Allocate(m * n) != cudaSuccess || start.Create(true) != cudaSuccess ||
        stop.Create(true) != cudaSuccess) {
      Fail(__FILE__, __LINE__, "GEMM timing buffers");
      return -1.0;
    }
    const cudaStream_t s = compute_.stream();
    LaunchFillPattern(a.get(), m * k, s);
    LaunchFillPattern(b.get(), k * n, s);
    // y[m, n] = x[m, k] * w[n, k]^T: the shape of a projection of m tokens.
    if (compute_.Linear(a.get(), k, m, b.get(), n, k, c.get(), n, 0.0f) != 0) return -1.0;
    cudaEventRecord(start.get(), s);
    for (int r = 0; r < repeats; ++r) {
      if (compute_.Linear(a.get(), k, m, b.get(), n, k, c.get(), n, 0.0f) != 0) return -1.0;
    }
    cudaEventRecord(stop.get(), s);
    const cudaError_t e = cudaEventSynchronize(stop.get());
    if (e != cudaSuccess) {
      Fail(__FILE__, __LINE__, CudaMessage("cudaEventSynchronize", e));
      return -1.0;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start.get(), stop.get());
    return ms / 1000.0 / std::max(1, repeats);
  }

  // Used by sessions.
  int device() const { return device_; }
  int64_t kv_width() const { return kv_width_; }
  RopeConfig rope() const { return RopeFromDims(dims_); }
  int ForwardBatch(const MicroBatchPlan& batch, const ForwardItem* items,
                   SessionImpl* const* sessions);
  int RebuildGroup(SessionImpl& s, const PredictorsImpl::Group& g, int64_t begin, int64_t count);
  int Stage(cudaStream_t transfer, void* dst, const void* src, size_t bytes);
  std::mutex& mutex() { return mu_; }
  Compute& compute() { return compute_; }

 private:
  struct Layer {
    DeviceArray<__half> wqkv, wo, w_gate_up, w_down;  // fused [Wq; Wk; Wv], [Wgate; Wup]
    DeviceArray<float> attn_norm, ffn_norm, bqkv;
    uint32_t set = 0;  // WeightSlot bits
  };

  int BadShape(int32_t layer, int slot, int64_t rows, int64_t cols) {
    return Fail(__FILE__, __LINE__,
                "weight slot " + std::to_string(slot) + " of layer " + std::to_string(layer) +
                    " does not take a [" + std::to_string(rows) + ", " + std::to_string(cols) +
                    "] tensor");
  }
  Predictors* BadLayer(int32_t layer) {
    Fail(__FILE__, __LINE__, "group layer " + std::to_string(layer) + " out of range");
    return nullptr;
  }
  // Fails naming the first item ForwardMany cannot run.
  int CheckItems(const ForwardItem* items, int64_t count, std::vector<SessionImpl*>* sessions);
  int Upload(DeviceArray<float>& dst, const float* src, int64_t n) {  // mu_ held
    RKV_CUDA(dst.Allocate(n));
    RKV_CUDA(cudaMemcpyAsync(dst.get(), src, n * sizeof(float), cudaMemcpyHostToDevice,
                             compute_.stream()));
    return 0;
  }
  const int device_;
  const ModelDims dims_;
  int64_t q_width_ = 0, kv_width_ = 0, qkv_width_ = 0;
  std::mutex mu_;  // the compute stream, the weights' uploads and the scratch below
  Compute compute_;
  std::vector<Layer> layers_;
  DeviceArray<__half> embedding_, lm_head_;
  DeviceArray<float> output_norm_;
  DeviceArray<float> x_, qkv_, attn_, gate_up_, logits_, features_, rebuilt_;
  DeviceArray<__half> xh_, qkvh_;
  // A micro-batch's token ids, positions and logit rows ([3, kMicroBatch]), and their host copy.
  DeviceArray<int32_t> ints_;
  std::vector<int32_t> host_ints_;
  std::mutex staging_mu_;
  PinnedBuffer staging_[kStagingSlots];
  Event staging_done_[kStagingSlots];
  int next_slot_ = 0;
};

int EngineImpl::CheckItems(const ForwardItem* items, int64_t count,
                           std::vector<SessionImpl*>* sessions) {
  if (items == nullptr || count < 1 || count > kMaxInt) {
    return Fail(__FILE__, __LINE__, "ForwardMany takes 1 to 2^31 - 1 items");
  }
  for (int64_t i = 0; i < count; ++i) {
    const ForwardItem& item = items[i];
    const std::string which = "item " + std::to_string(i) + ": ";
    auto* s = dynamic_cast<SessionImpl*>(item.session);
    if (s == nullptr || s->owner() != this) {
      return Fail(__FILE__, __LINE__, which + "a session of another engine");
    }
    if (std::find(sessions->begin(), sessions->end(), s) != sessions->end()) {
      return Fail(__FILE__, __LINE__, which + "a session appears twice in one pass");
    }
    if (item.tokens == nullptr || item.n < 1 || s->n_tokens() + item.n > s->capacity()) {
      return Fail(__FILE__, __LINE__,
                  which + std::to_string(item.n) + " tokens after " +
                      std::to_string(s->n_tokens()) + " do not fit the cache of " +
                      std::to_string(s->capacity()));
    }
    for (int64_t t = 0; t < item.n; ++t) {
      if (item.tokens[t] < 0 || item.tokens[t] >= dims_.vocab) {
        return Fail(
            __FILE__, __LINE__,
            which + "token id " + std::to_string(item.tokens[t]) + " outside the vocabulary");
      }
    }
    sessions->push_back(s);
  }
  return 0;
}

int EngineImpl::ForwardMany(const ForwardItem* items, int64_t count) {
  DeviceScope scope(device_);
  std::vector<SessionImpl*> sessions;
  RKV_TRY(CheckItems(items, count, &sessions));
  std::vector<PlanItem> plan_items(count);
  std::vector<int64_t> first(count);  // each session's token count before the call
  for (int64_t i = 0; i < count; ++i) {
    plan_items[i] = {items[i].n, items[i].all_logits != 0, items[i].logits != nullptr};
    first[i] = sessions[i]->n_tokens();
  }
  std::lock_guard<std::mutex> lock(mu_);
  const cudaStream_t st = compute_.stream();
  int rc = 0;
  for (SessionImpl* s : sessions) {
    if ((rc = s->WaitTransfers(st)) != 0) return rc;
  }
  for (const MicroBatchPlan& batch :
       PlanMicroBatches(plan_items.data(), static_cast<int>(count), kMicroBatch)) {
    if ((rc = ForwardBatch(batch, items, sessions.data())) != 0) break;
  }
  // Logits went to the host through blocking copies; a pass without any stays queued, as the
  // work that follows on the stream would wait for it anyway.
  const bool any_logits = std::any_of(
      items, items + count, [](const ForwardItem& item) { return item.logits != nullptr; });
  if (rc == 0 && any_logits) {
    const cudaError_t e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) rc = Fail(__FILE__, __LINE__, CudaMessage("cudaStreamSynchronize", e));
  }
  // A failed pass leaves no session advanced; rows it wrote past a session's count are never
  // read before they are written again.
  if (rc != 0) {
    for (int64_t i = 0; i < count; ++i) sessions[i]->SetTokens(first[i]);
  }
  return rc;
}

int EngineImpl::ForwardBatch(const MicroBatchPlan& batch, const ForwardItem* items,
                             SessionImpl* const* sessions) {
  const ModelDims& d = dims_;
  const cudaStream_t st = compute_.stream();
  const RopeConfig r = rope();
  Compute& c = compute_;
  const int64_t n = batch.rows;
  // [ids n][positions n][logit rows]: one copy per micro-batch. From pageable memory it is
  // staged before cudaMemcpyAsync returns, so the host vector may be refilled at once.
  host_ints_.resize(2 * n + batch.logit_rows);
  int32_t* ids = host_ints_.data();
  int32_t* positions = ids + n;
  int32_t* logit_rows = positions + n;
  int64_t gathered = 0;
  for (const PlanPiece& p : batch.pieces) {
    const int64_t pos0 = sessions[p.item]->n_tokens();
    for (int64_t i = 0; i < p.count; ++i) {
      ids[p.row + i] = items[p.item].tokens[p.start + i];
      positions[p.row + i] = static_cast<int32_t>(pos0 + i);
    }
    for (int64_t i = p.count - p.logit_rows; i < p.count; ++i) {
      logit_rows[gathered++] = static_cast<int32_t>(p.row + i);
    }
  }
  int32_t* dev_ids = ints_.get();
  int32_t* dev_positions = dev_ids + n;
  int32_t* dev_logit_rows = dev_positions + n;
  RKV_CUDA(cudaMemcpyAsync(dev_ids, ids, host_ints_.size() * sizeof(int32_t),
                           cudaMemcpyHostToDevice, st));
  RKV_CUDA(LaunchEmbed(embedding_.get(), d.hidden, dev_ids, n, x_.get(), st));
  for (int64_t l = 0; l < d.n_layers; ++l) {
    const Layer& w = layers_[l];
    const auto layer = static_cast<int32_t>(l);
    RKV_CUDA(LaunchRmsNormHalf(x_.get(), n, d.hidden, w.attn_norm.get(), d.rms_eps, xh_.get(), st));
    RKV_TRY(c.Linear(xh_.get(), d.hidden, n, w.wqkv.get(), qkv_width_, d.hidden, qkv_.get(),
                     qkv_width_, 0.0f));
    if (d.qkv_bias) RKV_CUDA(LaunchAddBias(qkv_.get(), w.bqkv.get(), n, qkv_width_, st));
    // Q's heads and K's heads lie side by side in each row: one rotation for both, each row at
    // its own session's position.
    RKV_CUDA(LaunchRope(qkv_.get(), n, qkv_width_, d.n_heads + d.n_kv_heads, dev_positions, 0, r, 0,
                        st));
    for (const PlanPiece& p : batch.pieces) {
      SessionImpl& s = *sessions[p.item];
      const int64_t pos0 = s.n_tokens();
      __half* kc = s.rows(layer, 0);
      __half* vc = s.rows(layer, 1);
      float* q = qkv_.get() + p.row * qkv_width_;
      RKV_CUDA(LaunchStoreKv(q + q_width_, p.count, kv_width_, qkv_width_, kc + pos0 * kv_width_,
                             vc + pos0 * kv_width_, st));
      RKV_TRY(c.AttentionF32(q, qkv_width_, p.count, pos0, kc, vc, d.n_heads, d.n_kv_heads,
                             d.head_dim, attn_.get() + p.row * q_width_,
                             qkvh_.get() + p.row * qkv_width_));
    }
    RKV_CUDA(LaunchToHalf(attn_.get(), n * q_width_, xh_.get(), st));
    RKV_TRY(
        c.Linear(xh_.get(), q_width_, n, w.wo.get(), d.hidden, q_width_, x_.get(), d.hidden, 1.0f));
    RKV_CUDA(LaunchRmsNormHalf(x_.get(), n, d.hidden, w.ffn_norm.get(), d.rms_eps, xh_.get(), st));
    RKV_TRY(c.Linear(xh_.get(), d.hidden, n, w.w_gate_up.get(), 2 * d.ffn, d.hidden, gate_up_.get(),
                     2 * d.ffn, 0.0f));
    RKV_CUDA(LaunchSwiGluHalf(gate_up_.get(), n, d.ffn, 2 * d.ffn, d.ffn, xh_.get(), st));
    RKV_TRY(
        c.Linear(xh_.get(), d.ffn, n, w.w_down.get(), d.hidden, d.ffn, x_.get(), d.hidden, 1.0f));
    for (const PlanPiece& p : batch.pieces) RKV_TRY(sessions[p.item]->MarkComputeUse(layer, st));
  }
  for (const PlanPiece& p : batch.pieces) {
    SessionImpl& s = *sessions[p.item];
    RKV_TRY(s.SetTokens(s.n_tokens() + p.count));
  }
  if (batch.logit_rows == 0) return 0;
  // The wanted rows of every piece, gathered and normalised into one lm-head input.
  const __half* head = d.tied ? embedding_.get() : lm_head_.get();
  RKV_CUDA(LaunchGatherRmsNormHalf(x_.get(), dev_logit_rows, batch.logit_rows, d.hidden,
                                   output_norm_.get(), d.rms_eps, xh_.get(), st));
  for (int64_t c0 = 0; c0 < batch.logit_rows; c0 += kLogitRows) {
    const int64_t rows = std::min(kLogitRows, batch.logit_rows - c0);
    RKV_TRY(c.Linear(xh_.get() + c0 * d.hidden, d.hidden, rows, head, d.vocab, d.hidden,
                     logits_.get(), d.vocab, 0.0f));
    // Each piece's share of this chunk to its item's logits. The next chunk overwrites the
    // device buffer only after these copies (same stream).
    int64_t g = 0;  // the piece's first gathered row
    for (const PlanPiece& p : batch.pieces) {
      const int64_t lo = std::max(g, c0), hi = std::min(g + p.logit_rows, c0 + rows);
      if (lo < hi) {
        float* dst = items[p.item].logits + (p.logit_dest + lo - g) * d.vocab;
        RKV_CUDA(cudaMemcpyAsync(dst, logits_.get() + (lo - c0) * d.vocab,
                                 (hi - lo) * d.vocab * sizeof(float), cudaMemcpyDeviceToHost, st));
      }
      g += p.logit_rows;
    }
  }
  return 0;
}

int EngineImpl::RebuildGroup(SessionImpl& s, const PredictorsImpl::Group& g, int64_t begin,
                             int64_t count) {
  const cudaStream_t st = compute_.stream();
  const int64_t out = 2 * static_cast<int64_t>(g.targets.size()) * kv_width_;
  RKV_CUDA(features_.Reserve(count * g.features));
  RKV_CUDA(rebuilt_.Reserve(count * out));
  LayerPointers anchors{}, targets{};
  for (size_t i = 0; i < g.anchors.size(); ++i) {
    anchors.k[i] = s.rows(g.anchors[i], 0);
    anchors.v[i] = s.rows(g.anchors[i], 1);
  }
  for (size_t i = 0; i < g.targets.size(); ++i) {
    targets.k[i] = s.rows(g.targets[i], 0);
    targets.v[i] = s.rows(g.targets[i], 1);
  }
  RKV_CUDA(LaunchGatherFeatures(anchors, static_cast<int>(g.anchors.size()), begin, count,
                                kv_width_, rope(), features_.get(), st));
  // rebuilt[count, out] = features[count, F] * a[out, F]^T, f32 throughout.
  const float one = 1.0f, zero = 0.0f;
  const GemmPlan p = RebuildPlan(count, out, g.features);
  RKV_BLAS(cublasSgemm(compute_.blas(), Op(p.trans_a), Op(p.trans_b), I(p.m), I(p.n), I(p.k), &one,
                       g.a.get(), I(p.lda), features_.get(), I(p.ldb), &zero, rebuilt_.get(),
                       I(p.ldc)));
  RKV_CUDA(LaunchScatterRebuilt(rebuilt_.get(), g.c.get(), targets,
                                static_cast<int>(g.targets.size()), begin, count, kv_width_, rope(),
                                st));
  for (int32_t a : g.anchors) RKV_TRY(s.MarkComputeUse(a, st));
  for (int32_t t : g.targets) RKV_TRY(s.MarkComputeUse(t, st));
  return 0;
}

int EngineImpl::Stage(cudaStream_t transfer, void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lock(staging_mu_);
  auto* out = static_cast<uint8_t*>(dst);
  const auto* in = static_cast<const uint8_t*>(src);
  while (bytes > 0) {
    const int slot = next_slot_;
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    // The slot's previous copy must have left the pinned buffer before it is overwritten.
    RKV_CUDA(cudaEventSynchronize(staging_done_[slot].get()));
    const size_t n = std::min(bytes, kStagingSlotBytes);
    std::memcpy(staging_[slot].get(), in, n);
    RKV_CUDA(cudaMemcpyAsync(out, staging_[slot].get(), n, cudaMemcpyHostToDevice, transfer));
    RKV_CUDA(cudaEventRecord(staging_done_[slot].get(), transfer));
    out += n;
    in += n;
    bytes -= n;
  }
  return 0;
}

int SessionImpl::Init() {
  const ModelDims& d = engine_.dims();
  RKV_CUDA(kv_.Allocate(static_cast<size_t>(d.n_layers) * 2 * capacity_ * engine_.kv_width()));
  RKV_CUDA(transfer_.Create());
  RKV_CUDA(transfers_done_.Create());
  RKV_CUDA(rebuilt_.Create());
  layer_ready_.resize(d.n_layers);
  layer_used_.resize(d.n_layers);
  for (Event& e : layer_ready_) RKV_CUDA(e.Create());
  for (Event& e : layer_used_) RKV_CUDA(e.Create());
  // Rows marked valid but never written read as zeros, as in a host KvCache.
  RKV_CUDA(cudaMemsetAsync(kv_.get(), 0, kv_.bytes(), transfer_.get()));
  RKV_CUDA(cudaStreamSynchronize(transfer_.get()));
  return 0;
}

SessionImpl::~SessionImpl() {
  DeviceScope scope(engine_.device());
  // Queued work may still use the cache; cudaFree waits for the device, these for the streams.
  cudaStreamSynchronize(transfer_.get());
  std::lock_guard<std::mutex> lock(engine_.mutex());
  cudaStreamSynchronize(engine_.compute().stream());
}

int SessionImpl::MarkComputeUse(int32_t layer, cudaStream_t compute) {
  RKV_CUDA(cudaEventRecord(layer_used_[layer].get(), compute));
  return 0;
}

__half* SessionImpl::rows(int32_t layer, int values) const {
  return kv_.get() + (static_cast<int64_t>(layer) * 2 + values) * capacity_ * engine_.kv_width();
}

int SessionImpl::CheckRows(int32_t layer, int values, int64_t first, int64_t count) {
  if (layer < 0 || layer >= engine_.dims().n_layers || (values != 0 && values != 1) || first < 0 ||
      count < 0 || first + count > capacity_) {
    return Fail(__FILE__, __LINE__,
                "rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
                    ") of layer " + std::to_string(layer) + " outside the cache of " +
                    std::to_string(capacity_) + " rows and " +
                    std::to_string(engine_.dims().n_layers) + " layers");
  }
  return 0;
}

int SessionImpl::WaitTransfers(cudaStream_t compute) {
  RKV_CUDA(cudaEventRecord(transfers_done_.get(), transfer_.get()));
  RKV_CUDA(cudaStreamWaitEvent(compute, transfers_done_.get(), 0));
  return 0;
}

int SessionImpl::Forward(const int32_t* tokens, int64_t n, int all_logits, float* logits) {
  ForwardItem item;
  item.session = this;
  item.tokens = tokens;
  item.n = n;
  item.all_logits = all_logits;
  item.logits = logits;
  return engine_.ForwardMany(&item, 1);
}

int SessionImpl::UploadRows(int32_t layer, int values, int64_t first, int64_t count,
                            const uint16_t* src) {
  DeviceScope scope(engine_.device());
  RKV_TRY(CheckRows(layer, values, first, count));
  const int64_t w = engine_.kv_width();
  // Not before queued work that reads or writes this layer (a rebuild, a forward pass).
  RKV_CUDA(cudaStreamWaitEvent(transfer_.get(), layer_used_[layer].get(), 0));
  __half* dst = rows(layer, values) + first * w;
  const size_t bytes = count * w * sizeof(__half);
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, src) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is staged like pageable memory
  } else if (attributes.type == cudaMemoryTypeHost) {  // page-locked: DMA straight from it
    RKV_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, transfer_.get()));
    return 0;
  }
  return engine_.Stage(transfer_.get(), dst, src, bytes);
}

int SessionImpl::MarkLayerUploaded(int32_t layer) {
  DeviceScope scope(engine_.device());
  RKV_TRY(CheckRows(layer, 0, 0, 0));
  RKV_CUDA(cudaEventRecord(layer_ready_[layer].get(), transfer_.get()));
  return 0;
}

int SessionImpl::Rebuild(const Predictors* p, int group, int64_t begin, int64_t count) {
  DeviceScope scope(engine_.device());
  const auto* preds = dynamic_cast<const PredictorsImpl*>(p);
  if (preds == nullptr || preds->engine != &engine_) {
    return Fail(__FILE__, __LINE__, "the predictors belong to another engine");
  }
  if (group < 0 || group >= static_cast<int>(preds->groups.size())) {
    return Fail(__FILE__, __LINE__, "no predictor group " + std::to_string(group));
  }
  RKV_TRY(CheckRows(0, 0, begin, count));
  if (count == 0) return 0;
  const PredictorsImpl::Group& g = preds->groups[group];
  std::lock_guard<std::mutex> lock(engine_.mutex());
  const cudaStream_t st = engine_.compute().stream();
  // After the uploads marked into its anchors (which it reads) and its targets (which it
  // overwrites); a layer never marked has nothing to wait for.
  for (int32_t a : g.anchors) RKV_CUDA(cudaStreamWaitEvent(st, layer_ready_[a].get(), 0));
  for (int32_t t : g.targets) RKV_CUDA(cudaStreamWaitEvent(st, layer_ready_[t].get(), 0));
  RKV_TRY(engine_.RebuildGroup(*this, g, begin, count));
  RKV_CUDA(cudaEventRecord(rebuilt_.get(), st));
  return 0;
}

int SessionImpl::WaitRebuilds() {
  DeviceScope scope(engine_.device());
  RKV_CUDA(cudaEventSynchronize(rebuilt_.get()));
  return 0;
}

int SessionImpl::DownloadRows(int32_t layer, int values, int64_t first, int64_t count,
                              uint16_t* dst) {
  DeviceScope scope(engine_.device());
  RKV_TRY(CheckRows(layer, values, first, count));
  RKV_TRY(Synchronize());
  const int64_t w = engine_.kv_width();
  RKV_CUDA(cudaMemcpy(dst, rows(layer, values) + first * w, count * w * sizeof(__half),
                      cudaMemcpyDeviceToHost));
  return 0;
}

int SessionImpl::Synchronize() {
  DeviceScope scope(engine_.device());
  RKV_CUDA(cudaStreamSynchronize(transfer_.get()));
  std::lock_guard<std::mutex> lock(engine_.mutex());
  RKV_CUDA(cudaStreamSynchronize(engine_.compute().stream()));
  return 0;
}

// Single ops over host buffers, through the same launchers and GEMM paths as the engine.
class OpsImpl final : public Ops {
 public:
  explicit OpsImpl(int device) : device_(device) {}
  int Init() {
    DeviceScope scope(device_);
    return compute_.Init();
  }
  const char* error() const override { return LastError().c_str(); }

  int MatMul(const float* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols,
             const float* bias, float* y) override {
    DeviceScope scope(device_);
    DeviceArray<float> dx, dy, db;
    DeviceArray<__half> dxh, dw;
    RKV_TRY(In(dx, x, n * cols));
    RKV_CUDA(dxh.Allocate(n * cols));
    RKV_TRY(In(dw, reinterpret_cast<const __half*>(w), rows * cols));
    RKV_CUDA(dy.Allocate(n * rows));
    RKV_CUDA(LaunchToHalf(dx.get(), n * cols, dxh.get(), s()));
    RKV_TRY(compute_.Linear(dxh.get(), cols, n, dw.get(), rows, cols, dy.get(), rows, 0.0f));
    if (bias != nullptr) {
      RKV_TRY(In(db, bias, rows));
      RKV_CUDA(LaunchAddBias(dy.get(), db.get(), n, rows, s()));
    }
    return Out(y, dy, n * rows);
  }

  int RmsNorm(const float* x, int64_t n, int64_t d, const float* weight, float eps,
              float* y) override {
    DeviceScope scope(device_);
    DeviceArray<float> dx, dw;
    RKV_TRY(In(dx, x, n * d));
    RKV_TRY(In(dw, weight, d));
    RKV_CUDA(LaunchRmsNorm(dx.get(), n, d, dw.get(), eps, dx.get(), s()));
    return Out(y, dx, n * d);
  }

  int Rope(float* x, int64_t n, int64_t heads, const int32_t* positions, int64_t head_dim,
           int64_t rope_dim, double base, int interleaved, int inverse) override {
    DeviceScope scope(device_);
    DeviceArray<float> dx;
    DeviceArray<int32_t> dp;
    RKV_TRY(In(dx, x, n * heads * head_dim));
    RKV_TRY(In(dp, positions, n));
    RKV_CUDA(LaunchRope(dx.get(), n, heads * head_dim, heads, dp.get(), 0,
                        {head_dim, rope_dim, base, interleaved}, inverse, s()));
    return Out(x, dx, n * heads * head_dim);
  }

  int Embed(const uint16_t* table, int64_t rows, int64_t cols, const int32_t* ids, int64_t n,
            float* out) override {
    DeviceScope scope(device_);
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= rows) return Fail(__FILE__, __LINE__, "id out of range");
    }
    DeviceArray<__half> dt;
    DeviceArray<int32_t> di;
    DeviceArray<float> dout;
    RKV_TRY(In(dt, reinterpret_cast<const __half*>(table), rows * cols));
    RKV_TRY(In(di, ids, n));
    RKV_CUDA(dout.Allocate(n * cols));
    RKV_CUDA(LaunchEmbed(dt.get(), cols, di.get(), n, dout.get(), s()));
    return Out(out, dout, n * cols);
  }

  int SwiGlu(const float* gate, const float* up, int64_t n, float* out) override {
    DeviceScope scope(device_);
    DeviceArray<float> din, dout;
    RKV_CUDA(din.Allocate(2 * n));
    RKV_CUDA(cudaMemcpyAsync(din.get(), gate, n * sizeof(float), cudaMemcpyHostToDevice, s()));
    RKV_CUDA(cudaMemcpyAsync(din.get() + n, up, n * sizeof(float), cudaMemcpyHostToDevice, s()));
    RKV_CUDA(dout.Allocate(n));
    // As one row of width n whose up half starts n elements later.
    RKV_CUDA(LaunchSwiGlu(din.get(), 1, n, 2 * n, n, dout.get(), s()));
    return Out(out, dout, n);
  }

  int Attention(const float* q, int64_t n, int64_t q_pos0, const uint16_t* k, const uint16_t* v,
                int64_t n_ctx, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                float* out) override {
    DeviceScope scope(device_);
    if (n_heads % n_kv_heads != 0 || n_ctx < q_pos0 + n) {
      return Fail(__FILE__, __LINE__, "attention shapes do not fit");
    }
    const int64_t qw = n_heads * head_dim, kvw = n_kv_heads * head_dim;
    DeviceArray<float> dq, dout;
    DeviceArray<__half> dqh, dk, dv;
    RKV_TRY(In(dq, q, n * qw));
    RKV_CUDA(dqh.Allocate(n * qw));
    RKV_TRY(In(dk, reinterpret_cast<const __half*>(k), n_ctx * kvw));
    RKV_TRY(In(dv, reinterpret_cast<const __half*>(v), n_ctx * kvw));
    RKV_CUDA(dout.Allocate(n * qw));
    RKV_TRY(compute_.AttentionF32(dq.get(), qw, n, q_pos0, dk.get(), dv.get(), n_heads, n_kv_heads,
                                  head_dim, dout.get(), dqh.get()));
    return Out(out, dout, n * qw);
  }

 private:
  cudaStream_t s() const { return compute_.stream(); }
  template <typename T>
  int In(DeviceArray<T>& d, const T* host, int64_t n) {
    RKV_CUDA(d.Allocate(n));
    RKV_CUDA(cudaMemcpyAsync(d.get(), host, n * sizeof(T), cudaMemcpyHostToDevice, s()));
    return 0;
  }
  int Out(float* host, const DeviceArray<float>& d, int64_t n) {
    RKV_CUDA(cudaMemcpyAsync(host, d.get(), n * sizeof(float), cudaMemcpyDeviceToHost, s()));
    RKV_CUDA(cudaStreamSynchronize(s()));
    return 0;
  }
  const int device_;
  Compute compute_;
};

void CopyError(const char* what, char* error, int error_len) {
  if (error != nullptr && error_len > 0) std::snprintf(error, error_len, "%s", what);
}

bool DeviceExists(int device, char* error, int error_len) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    CopyError(CudaMessage("cudaGetDeviceCount", e).c_str(), error, error_len);
    return false;
  }
  if (device < 0 || device >= count) {
    CopyError(
        ("no CUDA device " + std::to_string(device) + " (" + std::to_string(count) + " present)")
            .c_str(),
        error, error_len);
    return false;
  }
  return true;
}

}  // namespace
}  // namespace riskkv::cuda

extern "C" riskkv::cuda::Engine* riskkv_cuda_new_engine(int device,
                                                        const riskkv::cuda::ModelDims* dims,
                                                        char* error, int error_len) {
  using namespace riskkv::cuda;
  if (!DeviceExists(device, error, error_len)) return nullptr;
  auto engine = std::make_unique<EngineImpl>(device, *dims);
  if (engine->Init() != 0) {
    CopyError(engine->error(), error, error_len);
    return nullptr;
  }
  return engine.release();
}

extern "C" riskkv::cuda::Ops* riskkv_cuda_new_ops(int device, char* error, int error_len) {
  using namespace riskkv::cuda;
  if (!DeviceExists(device, error, error_len)) return nullptr;
  auto ops = std::make_unique<OpsImpl>(device);
  if (ops->Init() != 0) {
    CopyError(ops->error(), error, error_len);
    return nullptr;
  }
  return ops.release();
}
