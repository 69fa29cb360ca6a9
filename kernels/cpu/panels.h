// Quantized weight matrices regrouped in panels of 16 rows: each output row is one vector lane,
// so a block of 32 values takes eight vertical integer dots per 16 rows (AVX-512 VNNI; on AVX2,
// sixteen, eight rows at a time) instead of one horizontal dot per row. The arithmetic of every
// output is DotRowsQ8's (quant_dot.h), operation for operation: the same exact integer dot per
// block, converted and fused into the output's accumulator with the same scale, then the same
// offsets. So a MatMul over panels gives the same bits as one over the GGUF rows. A panel takes the
// bytes its rows take in the GGUF (within 3% for Q4_K and Q5_K, whose super-block scales it keeps
// per row). F16 and BF16 matrices have panels too, for their f32 products (DotF32's sums,
// fixed_order.h): their rows' values interleaved so that a product of eight rows reads memory as
// one stream.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/cpu/quant_dot.h"
#include "kernels/dtype.h"

namespace riskkv::cpu {

inline constexpr int64_t kPanelRows = 16;

// Whether DotPanelQ8 runs its AVX-512 VNNI kernel here (AVX-512 F, BW, VL and VNNI, checked at run
// time, the kernel compiled for them whatever the build's -march; and RISKKV_CPU_KERNELS not
// "avx2"); its AVX2 kernel otherwise, with the same bits.
bool PanelsSupported();

// Whether t has a panel layout (every quantized type, F16 and BF16).
bool HasPanels(DType t);
// Whether a rows x cols matrix of type t is regrouped in panels: t has them, rows % 16 == 0 and
// (F16, BF16) cols % 8 == 0.
bool FitsPanels(DType t, int64_t rows, int64_t cols);

// Bytes of one panel of 16 rows of `cols` values (a whole number of t's blocks).
int64_t PanelBytes(DType t, int64_t cols);

// A 64-byte-aligned buffer of panels.
struct PanelsFree {
  void operator()(uint8_t* p) const;
};
using Panels = std::unique_ptr<uint8_t[], PanelsFree>;

// The n_rows / 16 panels of the rows at `rows` (GGUF layout, row after row, with
// FitsPanels(t, n_rows, cols)): n_rows / 16 * PanelBytes(t, cols) bytes.
Panels PackPanels(DType t, const void* rows, int64_t n_rows, int64_t cols);

// F16 / BF16 panels: y[i * y_stride + r] = DotF32(row r of the panel as f32, x + i * x_stride,
// cols) for r < 16 and i < count (1 to 4), bit for bit; any AVX2 CPU.
void DotPanelF32(DType t, const uint8_t* panel, const float* x, int64_t x_stride, int count,
                 int64_t cols, float* y, int64_t y_stride);
// The 16 rows of an F16 / BF16 panel as f32, row after row (16 * cols floats).
void PanelRowsF32(DType t, const uint8_t* panel, int64_t cols, float* out);
// The F16 / BF16 panel layout of n_rows rows (n_rows % 16 == 0, cols % 8 == 0) into `out`.
void PackFloatPanels(const uint16_t* rows, int64_t n_rows, int64_t cols, uint16_t* out);

// y[i * y_stride + r] = dot(row r of the panel, activation row i) for r < 16 and i < count (1
// to 4), activation row i's blocks starting at x + i * stride; bit for bit DotRowsQ8's value.
void DotPanelQ8(DType t, const uint8_t* panel, const Q8Block* x, int64_t stride, int count,
                int64_t cols, float* y, int64_t y_stride);

}  // namespace riskkv::cpu
