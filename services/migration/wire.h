// What both ends of a migration stream agree on (proto/riskkv/v1/migration.proto): the protocol
// version, which layers a mode sends and in what order, the KV's wire form and how rows are cut
// into chunks and counted, and how the trailer's checksum over every chunk's CRC-32C is formed.
//
// A session's state is its token ids, its sampler (parameters and RNG state) and the KV of every
// token but the last: the last sampled token has not been fed yet, and feeding it is the target's
// first decode step, which yields the logits of the next token.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kvcodec/kv_codec.h"
#include "common/model/model_config.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"
#include "kernels/dtype.h"
#include "riskkv/v1/migration.pb.h"
#include "services/migration/migration_mode.h"

namespace riskkv {

// Version 1 covers the wire forms: a sender that names none sends plain rows, and a target that
// predates them refuses a quantized handshake before any KV moves (its byte count disagrees).
inline constexpr uint32_t kMigrationProtocolVersion = 1;

// The layers a mode sends, in sending order. RECONSTRUCT sends the policy's kept layers with the
// anchors of rebuilt groups first, group by group in layer order, so the target can rebuild each
// group as soon as its anchors have arrived; the other kept layers follow in ascending order.
// FULL_KV sends every layer in ascending order; TOKEN_REPLAY none.
std::vector<int32_t> SendOrder(MigrationMode mode, int64_t n_layers, const RetentionPolicy* policy);

// Rows per chunk: as many as fit max_chunk_bytes once encoded in `form` (rows of `dtype` for
// plain; the transform form's bound, TransformChunkBound, for it), at least one; for the
// quantized forms a whole number of kTokenGroup-token groups, at least one, so every chunk but a
// layer's last starts and ends on a group.
int64_t RowsPerChunk(int64_t max_chunk_bytes, WireForm form, int64_t kv_heads, int64_t head_dim,
                     DType dtype);
// The smallest max_chunk_bytes RowsPerChunk honours: one row (plain, transform) or one token
// group.
int64_t MinChunkBytes(WireForm form, int64_t kv_heads, int64_t head_dim, DType dtype);
// Rows a chunk holds at least, but for a layer's last: 1 (plain, transform) or kTokenGroup.
int64_t ChunkRowUnit(WireForm form);
// KV bytes a stream of `layers` layers of `history` rows carries in `form`; 0 for the transform
// form, whose sizes are known only as its rows are coded (a handshake announces 0).
int64_t StreamKvBytes(WireForm form, int64_t history, int64_t layers, int64_t kv_heads,
                      int64_t head_dim, DType dtype);

// KV bytes such a stream is expected to carry: StreamKvBytes for plain, int8 and int4; for the
// transform form, the policy's measured transform_bytes_per_token a layer and row (0 without a
// policy).
int64_t EstimateKvBytes(WireForm form, const RetentionPolicy* policy, int64_t history,
                        int64_t layers, const ModelConfig& config, DType dtype);

// Whether `bank` holds transforms a migration of this model can code the transform form with:
// one per layer, keys and values, of the model's KV heads and head_dim. FailedPrecondition
// naming what is missing or different.
absl::Status CheckTransforms(const PredictorBank* bank, const ModelConfig& config);

// The trailer's checksum: CRC-32C over the little-endian CRC-32C of every chunk, in order.
uint32_t ExtendWithCrc(uint32_t acc, uint32_t chunk_crc);

v1::KvDtype DtypeToProto(DType dtype);
// InvalidArgument for anything but KV_F32 and KV_F16.
absl::StatusOr<DType> DtypeFromProto(v1::KvDtype dtype);

v1::KvWireForm WireFormToProto(WireForm form);
// UNSPECIFIED (a sender that predates wire forms) reads as plain; InvalidArgument naming any
// value this build does not know.
absl::StatusOr<WireForm> WireFormFromProto(v1::KvWireForm form);

// A migration id as handshakes carry it: at most 64 lowercase hex digits (empty: a source that
// names none, which `required` refuses). InvalidArgument naming the id otherwise.
absl::Status CheckMigrationId(const std::string& id, bool required);

}  // namespace riskkv
