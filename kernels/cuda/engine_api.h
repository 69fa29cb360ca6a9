// The GPU engine inside libriskkv_cuda.so, as the host sees it: abstract classes whose methods
// take plain types only, created through the module's C entry points (module_abi.h). The host
// never includes CUDA headers; kernels/gpu.h wraps these in absl::Status and RAII.
//
// Every method that can fail returns 0 on success and a nonzero code otherwise, with a message
// naming the file, line and CUDA/cuBLAS error in error(): the calling thread's last failure, so
// threads sharing an engine read their own. Weights are f16 on the device, GEMMs
// run through cuBLAS with f32 accumulation, activations stay f32 between kernels, the KV cache
// is f16 ([capacity, n_kv_heads, head_dim] per layer, keys after RoPE, as the host KvCache).
#pragma once

#include <cstdint>

namespace riskkv::cuda {

struct ModelDims {
  int64_t n_layers = 0, hidden = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t rope_dim = 0;
  double rope_base = 10000.0;
  int rope_interleaved = 0;  // 1: pairs (2i, 2i+1); 0: pairs (i, i + rope_dim / 2)
  float rms_eps = 1e-5f;
  int qkv_bias = 0;  // Qwen2
  int tied = 0;      // lm head is the token embedding
  // Scaled RoPE: pair i's frequency divided by rope_divisors[i] (i < rope_dim / 2 <= 128), cos
  // and sin multiplied by rope_attn_factor.
  int rope_scaled = 0;
  double rope_attn_factor = 1.0;
  double rope_divisors[128] = {};
};

// Weight slots of one layer (SetMatrix / SetVector with layer >= 0), and of the model (layer -1).
enum WeightSlot : int {
  kWq,
  kWk,
  kWv,
  kWo,
  kWGate,
  kWUp,
  kWDown,  // matrices [out, in], f16
  kAttnNorm,
  kFfnNorm,
  kBq,
  kBk,
  kBv,  // vectors, f32
  kTokenEmbedding,
  kLmHead,
  kOutputNorm,  // layer -1
};

// Host memory the engine fills or reads asynchronously must outlive the call that synchronises
// (Session::Synchronize).

// A group's folded predictors on the device: every target's [A_k; A_v] stacked row-wise into
// one [T * 2 * kv_width, F] f32 matrix, so a group rebuilds with one GEMM.
class Predictors {
 public:
  virtual ~Predictors() = default;
};

class Session {
 public:
  virtual ~Session() = default;
  virtual const char* error() const = 0;
  virtual int64_t n_tokens() const = 0;
  virtual int64_t capacity() const = 0;
  // Marks rows [0, n) valid, as KvCache::SetTokens.
  virtual int SetTokens(int64_t n) = 0;
  // Runs tokens at positions [n_tokens, n_tokens + n), appends their K/V and advances. logits
  // (host) receives [all_logits ? n : 1, vocab] f32, or nothing when null. Engine::ForwardMany
  // with this session alone.
  virtual int Forward(const int32_t* tokens, int64_t n, int all_logits, float* logits) = 0;
  // Copies f16 rows [first, first + count) of layer K (values = 0) or V (values = 1) from host
  // memory into the device cache, on the transfer stream, returning before the copy ends.
  // Pageable `src` is staged through pinned buffers and may be reused at once; pinned `src`
  // (Engine::PinHostMemory) is copied directly and must stay unchanged until the copy is done
  // (Synchronize, or a rebuild or forward pass that reads the layer).
  virtual int UploadRows(int32_t layer, int values, int64_t first, int64_t count,
                         const uint16_t* src) = 0;
  // Records that every row of `layer` uploaded so far is what later rebuilds may read; a
  // rebuild waits on the transfer stream only up to its anchors' marks.
  virtual int MarkLayerUploaded(int32_t layer) = 0;
  // Rebuilds group `group` of `p` for rows [begin, begin + count) on the compute stream, once
  // the anchors' uploads are complete: features from the anchors' K (inverse RoPE) and V, one
  // GEMM, biases, RoPE on the keys, f16 rows written into the targets' cache.
  virtual int Rebuild(const Predictors* p, int group, int64_t begin, int64_t count) = 0;
  // Waits until the rebuilds this session queued so far are done (not its uploads).
  virtual int WaitRebuilds() = 0;
  // Copies f16 rows back to host memory (synchronously).
  virtual int DownloadRows(int32_t layer, int values, int64_t first, int64_t count,
                           uint16_t* dst) = 0;
  // Waits for every stream of the session.
  virtual int Synchronize() = 0;
};

// Device-side copies of single ops over host buffers, for checking each kernel against the CPU
// oracle. They run exactly the kernels the engine runs.
class Ops {
 public:
  virtual ~Ops() = default;
  virtual const char* error() const = 0;
  // y[n, rows] = x[n, cols] * w^T (+ bias), w f16 [rows, cols].
  virtual int MatMul(const float* x, int64_t n, const uint16_t* w, int64_t rows, int64_t cols,
                     const float* bias, float* y) = 0;
  virtual int RmsNorm(const float* x, int64_t n, int64_t d, const float* weight, float eps,
                      float* y) = 0;
  virtual int Rope(float* x, int64_t n, int64_t heads, const int32_t* positions, int64_t head_dim,
                   int64_t rope_dim, double base, int interleaved, int inverse) = 0;
  // out[n, cols] from the f16 table [rows, cols].
  virtual int Embed(const uint16_t* table, int64_t rows, int64_t cols, const int32_t* ids,
                    int64_t n, float* out) = 0;
  virtual int SwiGlu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // As Backend::Attention with an f16 cache of n_ctx >= q_pos0 + n rows.
  virtual int Attention(const float* q, int64_t n, int64_t q_pos0, const uint16_t* k,
                        const uint16_t* v, int64_t n_ctx, int64_t n_heads, int64_t n_kv_heads,
                        int64_t head_dim, float* out) = 0;
};

// One session's share of Engine::ForwardMany, as Session::Forward's arguments.
struct ForwardItem {
  Session* session = nullptr;  // one of this engine's, at most once per call
  const int32_t* tokens = nullptr;
  int64_t n = 0;  // >= 1, n_tokens + n <= capacity
  int all_logits = 0;
  float* logits = nullptr;  // host [all_logits ? n : 1, vocab] f32, or null for none
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const char* error() const = 0;
  virtual const ModelDims& dims() const = 0;
  // Uploads a weight. Matrices are f16 [rows, cols] (rows = out features); vectors f32.
  virtual int SetMatrix(int32_t layer, int slot, const uint16_t* data, int64_t rows,
                        int64_t cols) = 0;
  virtual int SetVector(int32_t layer, int slot, const float* data, int64_t n) = 0;
  // Checks every weight the dims call for has been set.
  virtual int Finalize() = 0;
  virtual int64_t device_bytes() const = 0;
  // Runs every item in shared forward passes: the weight GEMMs (QKV, output, gate/up, down, lm
  // head) once over the items' concatenated rows, in micro-batches that cut an item only where
  // Session::Forward over it alone would; RoPE at each row's own position, the K/V store and
  // attention per item against its own cache; logits only for the rows wanted. Checks every
  // item first and runs none when one is bad. A device error fails the call and leaves every
  // session's token count as it was (rows past it may have been written).
  virtual int ForwardMany(const ForwardItem* items, int64_t count) = 0;
  // A session with a device KV cache of `capacity` rows; null with error() on failure.
  virtual Session* NewSession(int64_t capacity) = 0;
  // Groups: anchors[n_anchors] and targets[n_targets] per group (concatenated), a[g] is the
  // stacked [T*2*kv_width, F] f32 matrix and c[g] the stacked [T*2*kv_width] biases.
  virtual Predictors* NewPredictors(int n_groups, const int32_t* n_anchors, const int32_t* anchors,
                                    const int32_t* n_targets, const int32_t* targets,
                                    const float* const* a, const float* const* c) = 0;
  // Page-locks host memory so uploads from it run as direct DMA; unpin before freeing it.
  virtual int PinHostMemory(void* p, int64_t bytes) = 0;
  virtual int UnpinHostMemory(void* p) = 0;
  // Seconds of one dense f16 GEMM of [m, k] x [k, n] timed on the device (for throughput
  // reports), or a negative value with error().
  virtual double TimeGemm(int64_t m, int64_t n, int64_t k, int repeats) = 0;
};

}  // namespace riskkv::cuda
