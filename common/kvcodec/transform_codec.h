// Transform coding of a layer's key or value rows (KVTC's scheme: decorrelate, allocate, entropy
// code), version kTransformCodecVersion:
//
// 1. Each row's head h goes to the transform's coordinates, y = B_h (x - mean_h) (kv_transform.h).
// 2. Bit allocation by reverse water-filling at one distortion level for every component: a
//    uniform quantizer of step `step` leaves each component an error of variance step^2 / 12,
//    so a component whose fitted variance is at most that is dropped (decoded as 0, which costs
//    it exactly its variance) and every other is coded as c = y * (1 / step) rounded to the
//    nearest integer (ties to even), saturated to [-32767, 32767]. The step sets the rate: an
//    ideal entropy coder spends about log2(sigma / step) + 2 bits on a Gaussian component at
//    high rate, fewer at low rate, and none on a dropped one.
// 3. Entropy coding: the codes, head by head, component by component (coded components in
//    index order), token by token, zigzagged to 16 bits and split into a plane of low bytes
//    followed by a plane of high bytes, compressed as one zstd frame that states its content
//    size. That frame is the whole chunk.
//
// The decoder x' = mean_h + sum over coded i of (c_i * step) B_h[i] depends only on the
// transform, the step, the row count and the bytes: rows decode the same however a layer is
// cut into chunks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kvcodec/kv_transform.h"

namespace riskkv {

// Named by a migration's handshake beside the transforms' identity; a target refuses others.
inline constexpr uint32_t kTransformCodecVersion = 1;

// Whether component `i` of a head with this fitted variance is coded at `step`.
inline bool ComponentCoded(float variance, float step) {
  return static_cast<double>(variance) > static_cast<double>(step) * step / 12.0;
}

// Coded components over every head of `t` at `step`.
int64_t CodedComponents(const LayerTransform& t, float step);

// Encodes rows [count, heads * dim] into *out, replacing its contents. Non-finite values code as
// the head's mean. `t` should have passed CheckTransform (what the codec needs of its shape is
// checked here); step must be a finite normal float > 0; zstd_level as zstd takes it (1 to 19;
// negative levels are faster). InvalidArgument for a bad step, level or shape, or a count outside
// [1, 2^24].
absl::Status EncodeTransformed(const LayerTransform& t, float step, const float* rows,
                               int64_t count, int zstd_level, std::string* out);

// Decodes a chunk of `count` rows into out [count, heads * dim], with `t` as Encode takes it.
// InvalidArgument, nothing promised about `out`, for: a bad step, shape or count (as Encode),
// bytes that are not exactly one zstd frame (truncated, followed by more, or a skippable frame),
// a frame that does not state its content size or states one other than
// the count's (checked before anything is decompressed, so a frame cannot make the decoder
// allocate more than the rows need), a frame that does not decompress to what it states, a code
// the encoder never writes (-32768), and
// decoded values that are not finite or leave the f16 range (the token and channel named).
absl::Status DecodeTransformed(const LayerTransform& t, float step, std::string_view data,
                               int64_t count, float* out);

// rows := Decode(Encode(rows)), and the encoded size: what a target holds and what crossed.
absl::StatusOr<int64_t> RoundTripTransformed(const LayerTransform& t, float step, float* rows,
                                             int64_t count, int zstd_level);

// The step a policy's step ratio gives a layer's transform: ratio times the rows' RMS around
// their mean (LayerTransform::Rms), at least 1e-6, computed the same on both ends.
float TransformStep(const LayerTransform& t, double ratio);

// The zstd level a migration encodes its chunks at (the decoder does not depend on it).
inline constexpr int kTransformWireZstdLevel = 3;

// A migration chunk in the transform wire form (wire_form.h): rows [first_token, first_token +
// count) of one layer's keys or values. Rows among the history's first kSinkTokens (the
// attention sink, kv_codec.h) cross in f16 ([n, width], NaN as 0, beyond the f16 range
// saturated), then, if rows remain, EncodeTransformed's frame of them. Rows decode the same
// however the layer is cut into chunks.
//
// The most bytes such a chunk takes; a receiver refuses a larger one.
// width is the transform's heads * dim.
int64_t TransformChunkBound(int64_t width, int64_t first_token, int64_t count);
// EncodeTransformed's errors, and InvalidArgument for a negative first_token.
absl::Status EncodeTransformChunk(const LayerTransform& t, float step, const float* rows,
                                  int64_t first_token, int64_t count, int zstd_level,
                                  std::string* out);
// DecodeTransformed's errors for the coded rows, and InvalidArgument for a negative first_token,
// a chunk shorter than its sink rows, and a sink value that is not finite.
absl::Status DecodeTransformChunk(const LayerTransform& t, float step, std::string_view data,
                                  int64_t first_token, int64_t count, float* out);

}  // namespace riskkv
