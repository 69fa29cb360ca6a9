// The engine's kernels other than GEMMs (those go through cuBLAS). Numerics follow the CPU
// backend (kernels/cpu/cpu_backend.cc): RoPE angles in double, cos/sin rounded to f32.
#include <cmath>

#include "kernels/cuda/kernels.cuh"

namespace riskkv::cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned Blocks(int64_t total) {
  const int64_t b = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1 << 22) ? (1 << 22) : b));
}

#define RKV_GRID_STRIDE(i, total)                                                            \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (total); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

template <bool kMax>
__device__ float BlockReduce(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // an earlier call may still be reading `shared`
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, w) : v + w;
  }
  return v;
}

__global__ void EmbedKernel(const __half* table, int64_t cols, const int32_t* ids, int64_t n,
                            float* out) {
  RKV_GRID_STRIDE(idx, n * cols) {
    const int64_t i = idx / cols, j = idx % cols;
    out[idx] = __half2float(table[static_cast<int64_t>(ids[i]) * cols + j]);
  }
}

// Block i normalises row i of x, or row rows[i] when rows is not null, into row i of y.
template <typename Out>
__global__ void RmsNormKernel(const float* x, const int32_t* rows, int64_t d, const float* w,
                              float eps, Out* y) {
  __shared__ float shared[32];
  const int64_t source = rows != nullptr ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + source * d;
  Out* yr = y + blockIdx.x * d;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
  ss = BlockReduce<false>(ss, shared);
  const float scale = rsqrtf(ss / static_cast<float>(d) + eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = xr[j] * scale * w[j];
    if constexpr (sizeof(Out) == 2) {
      yr[j] = ToHalfSat(v);
    } else {
      yr[j] = v;
    }
  }
}

// Single-query attention (decoding): one block per query head. The head's scores over the
// `ctx` keys live in shared memory; q is f32, K and V f16, accumulation f32.
__global__ void DecodeAttentionKernel(const float* q, const __half* k, const __half* v, int64_t ctx,
                                      int64_t kv_width, int64_t head_dim, int64_t group,
                                      float scale, float* out) {
  extern __shared__ float smem[];  // [head_dim] query, then [ctx] scores
  __shared__ float shared[32];
  const int64_t h = blockIdx.x;
  const int64_t kv_offset = (h / group) * head_dim;
  float* qs = smem;
  float* scores = smem + head_dim;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = q[h * head_dim + d];
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x) {
    const __half* kr = k + j * kv_width + kv_offset;
    float s = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) s += qs[d] * __half2float(kr[d]);
    s *= scale;
    scores[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = BlockReduce<true>(mx, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x) {
    const float e = expf(scores[j] - mx);
    scores[j] = e;
    sum += e;
  }
  sum = BlockReduce<false>(sum, shared);  // its barriers also publish every thread's scores
  const float inv = 1.0f / sum;
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < ctx; ++j)
      acc += scores[j] * __half2float(v[j * kv_width + kv_offset + d]);
    out[h * head_dim + d] = acc * inv;
  }
}

// K and V rows [n, width] (V `width` after K in each source row) into two f16 caches.
__global__ void StoreKvKernel(const float* src, int64_t n, int64_t width, int64_t stride, __half* k,
                              __half* v) {
  RKV_GRID_STRIDE(idx, n * 2 * width) { StoreKvAt(src, width, stride, k, v, idx); }
}

__global__ void RopeKernel(float* x, int64_t n, int64_t stride, int64_t heads,
                           const int32_t* positions, int64_t pos0, RopeConfig r, int inverse) {
  RKV_GRID_STRIDE(idx, n * heads * (r.rope_dim / 2)) {
    RotatePairAt(x, stride, heads, positions, pos0, r, inverse, idx);
  }
}

template <typename Out>
__global__ void SwiGluKernel(const float* in, int64_t n, int64_t width, int64_t stride,
                             int64_t up_offset, Out* out) {
  RKV_GRID_STRIDE(idx, n * width) {
    const int64_t i = idx / width, j = idx % width;
    const float g = in[i * stride + j];
    const float u = in[i * stride + up_offset + j];
    const float r = g / (1.0f + expf(-g)) * u;
    if constexpr (sizeof(Out) == 2) {
      out[idx] = ToHalfSat(r);
    } else {
      out[idx] = r;
    }
  }
}

__global__ void ToHalfKernel(const float* in, int64_t n, __half* out) {
  RKV_GRID_STRIDE(i, n) { out[i] = ToHalfSat(in[i]); }
}

__global__ void AddBiasKernel(float* y, const float* b, int64_t n, int64_t cols) {
  RKV_GRID_STRIDE(i, n * cols) { y[i] += b[i % cols]; }
}

__global__ void CausalSoftmaxKernel(const float* scores, int64_t n, int64_t ctx, int64_t q_pos0,
                                    __half* probs) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t visible = q_pos0 + row % n + 1;
  const float* s = scores + row * ctx;
  __half* p = probs + row * ctx;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) mx = fmaxf(mx, s[j]);
  mx = BlockReduce<true>(mx, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < visible; j += blockDim.x) sum += expf(s[j] - mx);
  sum = BlockReduce<false>(sum, shared);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < ctx; j += blockDim.x) {
    p[j] = __float2half(j < visible ? expf(s[j] - mx) * inv : 0.0f);
  }
}

__global__ void GatherFeaturesKernel(LayerPointers anchors, int n_anchors, int64_t begin,
                                     int64_t count, int64_t width, RopeConfig r, float* features) {
  RKV_GRID_STRIDE(idx, count * n_anchors * 2 * width) {
    features[idx] = GatherFeatureAt(anchors, n_anchors, begin, width, r, idx);
  }
}

__global__ void ScatterRebuiltKernel(const float* y, const float* c, LayerPointers targets,
                                     int n_targets, int64_t begin, int64_t count, int64_t width,
                                     RopeConfig r) {
  RKV_GRID_STRIDE(idx, count * n_targets * 2 * width) {
    ScatterRebuiltAt(y, c, targets, n_targets, begin, width, r, idx);
  }
}

__global__ void FillPatternKernel(__half* x, int64_t n) {
  RKV_GRID_STRIDE(i, n) {
    const uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    x[i] = __float2half(static_cast<float>(h >> 21) / 1024.0f - 1.0f);
  }
}

}  // namespace

cudaError_t LaunchEmbed(const __half* table, int64_t cols, const int32_t* ids, int64_t n,
                        float* out, cudaStream_t stream) {
  EmbedKernel<<<Blocks(n * cols), kThreads, 0, stream>>>(table, cols, ids, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* y,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RmsNormKernel<float><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, nullptr, d, w, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNormHalf(const float* x, int64_t n, int64_t d, const float* w, float eps,
                              __half* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RmsNormKernel<__half>
      <<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, nullptr, d, w, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchGatherRmsNormHalf(const float* x, const int32_t* rows, int64_t n, int64_t d,
                                    const float* w, float eps, __half* y, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  RmsNormKernel<__half><<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, rows, d, w, eps, y);
  return cudaGetLastError();
}

bool DecodeAttentionFits(int64_t ctx, int64_t head_dim) {
  return (ctx + head_dim) * static_cast<int64_t>(sizeof(float)) <= kDecodeAttentionSharedBytes;
}

cudaError_t LaunchDecodeAttention(const float* q, const __half* k, const __half* v, int64_t ctx,
                                  int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float* out,
                                  cudaStream_t stream) {
  if (!DecodeAttentionFits(ctx, head_dim)) return cudaErrorInvalidValue;
  const size_t shared = static_cast<size_t>(ctx + head_dim) * sizeof(float);
  DecodeAttentionKernel<<<static_cast<unsigned>(n_heads), kThreads, shared, stream>>>(
      q, k, v, ctx, n_kv_heads * head_dim, head_dim, n_heads / n_kv_heads,
      1.0f / sqrtf(static_cast<float>(head_dim)), out);
  return cudaGetLastError();
}

cudaError_t LaunchStoreKv(const float* src, int64_t n, int64_t width, int64_t stride, __half* k,
                          __half* v, cudaStream_t stream) {
  StoreKvKernel<<<Blocks(n * 2 * width), kThreads, 0, stream>>>(src, n, width, stride, k, v);
  return cudaGetLastError();
}

cudaError_t LaunchRope(float* x, int64_t n, int64_t stride, int64_t heads, const int32_t* positions,
                       int64_t pos0, const RopeConfig& rope, int inverse, cudaStream_t stream) {
  RopeKernel<<<Blocks(n * heads * (rope.rope_dim / 2)), kThreads, 0, stream>>>(
      x, n, stride, heads, positions, pos0, rope, inverse);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGlu(const float* in, int64_t n, int64_t width, int64_t stride,
                         int64_t up_offset, float* out, cudaStream_t stream) {
  SwiGluKernel<float>
      <<<Blocks(n * width), kThreads, 0, stream>>>(in, n, width, stride, up_offset, out);
  return cudaGetLastError();
}

cudaError_t LaunchSwiGluHalf(const float* in, int64_t n, int64_t width, int64_t stride,
                             int64_t up_offset, __half* out, cudaStream_t stream) {
  SwiGluKernel<__half>
      <<<Blocks(n * width), kThreads, 0, stream>>>(in, n, width, stride, up_offset, out);
  return cudaGetLastError();
}

cudaError_t LaunchToHalf(const float* in, int64_t n, __half* out, cudaStream_t stream) {
  ToHalfKernel<<<Blocks(n), kThreads, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* b, int64_t n, int64_t cols, cudaStream_t stream) {
  AddBiasKernel<<<Blocks(n * cols), kThreads, 0, stream>>>(y, b, n, cols);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmax(const float* scores, int64_t heads, int64_t n, int64_t ctx,
                                int64_t q_pos0, __half* probs, cudaStream_t stream) {
  if (heads * n == 0) return cudaSuccess;
  CausalSoftmaxKernel<<<static_cast<unsigned>(heads * n), kThreads, 0, stream>>>(scores, n, ctx,
                                                                                 q_pos0, probs);
  return cudaGetLastError();
}

cudaError_t LaunchGatherFeatures(const LayerPointers& anchors, int n_anchors, int64_t begin,
                                 int64_t count, int64_t width, const RopeConfig& rope,
                                 float* features, cudaStream_t stream) {
  GatherFeaturesKernel<<<Blocks(count * n_anchors * 2 * width), kThreads, 0, stream>>>(
      anchors, n_anchors, begin, count, width, rope, features);
  return cudaGetLastError();
}

cudaError_t LaunchScatterRebuilt(const float* y, const float* c, const LayerPointers& targets,
                                 int n_targets, int64_t begin, int64_t count, int64_t width,
                                 const RopeConfig& rope, cudaStream_t stream) {
  ScatterRebuiltKernel<<<Blocks(count * n_targets * 2 * width), kThreads, 0, stream>>>(
      y, c, targets, n_targets, begin, count, width, rope);
  return cudaGetLastError();
}

cudaError_t LaunchFillPattern(__half* x, int64_t n, cudaStream_t stream) {
  FillPatternKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n);
  return cudaGetLastError();
}

}  // namespace riskkv::cuda
