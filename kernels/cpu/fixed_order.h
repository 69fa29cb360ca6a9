// Float kernels whose every output is computed by one fixed sequence of operations, whatever the
// batch around it: how many rows are multiplied together, how they are blocked, and which thread
// computes them. They are what makes the CPU engine batch-invariant (a token's logits are the
// same bits in a prefill of n tokens, a micro-batch of it or a single decode step), so a
// migrated session reproduces its source exactly.
#pragma once

#include <cstdint>

namespace riskkv::cpu {

// dot(a, b) over n values: eight-lane fused multiply-adds in index order, a fixed horizontal sum,
// then the n % 8 trailing products fused in index order.
float DotF32(const float* a, const float* b, int64_t n);

// y[t * y_stride + r] = DotF32(w + r * w_stride, x + t * x_stride, n) for r < rows, t < tokens,
// bit for bit: blocking shares loads between outputs, never the order of an output's sum.
void DotTile(const float* w, int64_t w_stride, int64_t rows, const float* x, int64_t x_stride,
             int64_t tokens, int64_t n, float* y, int64_t y_stride);
// DotTile of f16 rows, each converted exactly to f32 as it is read: the bits of DotTile over the
// converted rows, without writing them out.
void DotTileF16(const uint16_t* w, int64_t w_stride, int64_t rows, const float* x, int64_t x_stride,
                int64_t tokens, int64_t n, float* y, int64_t y_stride);

// DotTile on AVX-512 (where PairTileSupported(), checked at run time): rows even, n % 8 == 0,
// the rows given interleaved in pairs by InterleavePairs. The same bits as DotTile over the
// rows; a 16-lane multiply-add holds two rows' eight-lane sums.
bool PairTileSupported();
void DotPairTile(const float* pairs, int64_t rows, const float* x, int64_t x_stride, int64_t tokens,
                 int64_t n, float* y, int64_t y_stride);
// Rows 2p and 2p + 1 (p < n_rows / 2) of the n-wide rows at `rows`, eight columns of one then
// eight of the other, pair after pair: the operand of DotPairTile.
void InterleavePairs(const float* rows, int64_t n_rows, int64_t n, float* out);

// out[t * out_stride + d] = sum over j < count + t of p[t * p_stride + j] * v[j * v_stride + d]
// for t < tokens and d < width, accumulated with fused multiply-adds in j order from zero (the
// causal shape of attention: each query sees one more row than the one before it).
void WeightedRows(const float* p, int64_t p_stride, int64_t tokens, int64_t count, const float* v,
                  int64_t v_stride, int64_t width, float* out, int64_t out_stride);

// The same sums with every t seeing `count` rows: the query heads that share one query's keys and
// values (GQA) as the `tokens`, so each value row is read once for all of them. The f16 form
// converts each value exactly to f32 as it is read.
void WeightedRowsShared(const float* p, int64_t p_stride, int64_t tokens, int64_t count,
                        const float* v, int64_t v_stride, int64_t width, float* out,
                        int64_t out_stride);
void WeightedRowsSharedF16(const float* p, int64_t p_stride, int64_t tokens, int64_t count,
                           const uint16_t* v, int64_t v_stride, int64_t width, float* out,
                           int64_t out_stride);

// A row of n attention scores, normalised in place: each scaled by `scale`, then e = exp(s - max)
// (vector_math.h's expf) with the max over the row; value j is added to lane j % 8 of an
// eight-lane sum in index order, the lanes are summed in HorizontalSum's order, and each e is
// multiplied by 1 / sum.
void Softmax(float* s, int64_t n, float scale);

// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i] (SiLU of the gate times up) for i < n, with
// vector_math.h's expf: each element's bits depend on its own inputs alone.
void SwiGluRow(const float* gate, const float* up, int64_t n, float* out);

// log(sum over j of exp(x[j] - max)) + max in double precision (vector_math.h's exp on each
// x[j] - max; value j added to lane j % 8 of eight double sums in index order, the lanes then
// summed in a fixed order): the normaliser of a row of logits.
double LogSumExp(const float* x, int64_t n);

}  // namespace riskkv::cpu
