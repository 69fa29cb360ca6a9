// Launchers of the engine's elementwise, normalisation, RoPE, softmax and KV kernels. Each
// enqueues on `stream` and returns the launch's error. Matrices are row-major; `stride` is the
// distance in elements between consecutive rows.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernel_math.cuh"

namespace riskkv::cuda {

cudaError_t LaunchEmbed(const __half* table, int64_t cols, const int32_t* ids, int64_t n,
                        float* out, cudaStream_t stream);
// y = x / sqrt(mean(x^2) + eps) * w per row of d; y may alias x.
cudaError_t LaunchRmsNorm(const float* x, int64_t n, int64_t d, const float* w, float eps, float* y,
                          cudaStream_t stream);
// The same normalisation written as f16 (saturating), the input of the next GEMM.
cudaError_t LaunchRmsNormHalf(const float* x, int64_t n, int64_t d, const float* w, float eps,
                              __half* y, cudaStream_t stream);
// Row i of y is row rows[i] (device indices) of x, normalised and written as f16: the rows of a
// batch whose logits are wanted, gathered into one lm-head GEMM.
cudaError_t LaunchGatherRmsNormHalf(const float* x, const int32_t* rows, int64_t n, int64_t d,
                                    const float* w, float eps, __half* y, cudaStream_t stream);
// Attention of one query per head (decoding) at the last of `ctx` positions: q [n_heads,
// head_dim] f32 over k/v [ctx, n_kv_heads, head_dim] f16 into out [n_heads, head_dim] f32, when
// DecodeAttentionFits (the scores fit the default shared memory of a block).
inline constexpr int64_t kDecodeAttentionSharedBytes = 40 << 10;
bool DecodeAttentionFits(int64_t ctx, int64_t head_dim);
cudaError_t LaunchDecodeAttention(const float* q, const __half* k, const __half* v, int64_t ctx,
                                  int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float* out,
                                  cudaStream_t stream);
// K then V rows of width `width` (V right after K in each of the n source rows, `stride` apart)
// into the f16 caches k and v (dense rows).
cudaError_t LaunchStoreKv(const float* src, int64_t n, int64_t width, int64_t stride, __half* k,
                          __half* v, cudaStream_t stream);
// Rotates heads [n, heads, head_dim] (rows `stride` apart) by positions[i], or pos0 + i when
// positions is null; inverse rotates by minus the position.
cudaError_t LaunchRope(float* x, int64_t n, int64_t stride, int64_t heads, const int32_t* positions,
                       int64_t pos0, const RopeConfig& rope, int inverse, cudaStream_t stream);
// out[i, j] = silu(in[i, j]) * in[i, up_offset + j] for j < width, rows `stride` apart in `in`.
cudaError_t LaunchSwiGlu(const float* in, int64_t n, int64_t width, int64_t stride,
                         int64_t up_offset, float* out, cudaStream_t stream);
cudaError_t LaunchSwiGluHalf(const float* in, int64_t n, int64_t width, int64_t stride,
                             int64_t up_offset, __half* out, cudaStream_t stream);
cudaError_t LaunchToHalf(const float* in, int64_t n, __half* out, cudaStream_t stream);
// y[i, j] += b[j] for rows of `cols`.
cudaError_t LaunchAddBias(float* y, const float* b, int64_t n, int64_t cols, cudaStream_t stream);
// Causal softmax over scores [rows = heads * n, ctx]: query i (row % n) sees keys
// [0, q_pos0 + i]; probabilities in f16, zero past the visible keys.
cudaError_t LaunchCausalSoftmax(const float* scores, int64_t heads, int64_t n, int64_t ctx,
                                int64_t q_pos0, __half* probs, cudaStream_t stream);
// Feature rows [count, 2 * n_anchors * width] for positions [begin, begin + count): for each
// anchor its key with RoPE undone, then its value.
cudaError_t LaunchGatherFeatures(const LayerPointers& anchors, int n_anchors, int64_t begin,
                                 int64_t count, int64_t width, const RopeConfig& rope,
                                 float* features, cudaStream_t stream);
// y [count, n_targets * 2 * width] (+ c) into the targets' caches: keys rotated by RoPE at
// positions [begin, begin + count), f16.
cudaError_t LaunchScatterRebuilt(const float* y, const float* c, const LayerPointers& targets,
                                 int n_targets, int64_t begin, int64_t count, int64_t width,
                                 const RopeConfig& rope, cudaStream_t stream);
// Fills n halfs with a deterministic pattern in [-1, 1) (GEMM timing inputs).
cudaError_t LaunchFillPattern(__half* x, int64_t n, cudaStream_t stream);

}  // namespace riskkv::cuda
