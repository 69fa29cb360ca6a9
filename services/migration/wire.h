// What both ends of a migration stream agree on (proto/riskkv/v1/migration.proto): the protocol
// version, which layers a mode sends and in what order, how rows are cut into chunks, and how
// the trailer's checksum over every chunk's CRC-32C is formed.
//
// A session's state is its token ids, its sampler (parameters and RNG state) and the KV of every
// token but the last: the last sampled token has not been fed yet, and feeding it is the target's
// first decode step, which yields the logits of the next token.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/recovery/retention_policy.h"
#include "kernels/dtype.h"
#include "riskkv/v1/migration.pb.h"
#include "services/migration/migration_mode.h"

namespace riskkv {

inline constexpr uint32_t kMigrationProtocolVersion = 1;

// The layers a mode sends, in sending order. RECONSTRUCT sends the policy's kept layers with the
// anchors of rebuilt groups first, group by group in layer order, so the target can rebuild each
// group as soon as its anchors have arrived; the other kept layers follow in ascending order.
// FULL_KV sends every layer in ascending order; TOKEN_REPLAY none.
std::vector<int32_t> SendOrder(MigrationMode mode, int64_t n_layers, const RetentionPolicy* policy);

// Rows per chunk for a layer whose K (or V) row has `row_bytes` bytes.
int64_t RowsPerChunk(int64_t max_chunk_bytes, int64_t row_bytes);

// The trailer's checksum: CRC-32C over the little-endian CRC-32C of every chunk, in order.
uint32_t ExtendWithCrc(uint32_t acc, uint32_t chunk_crc);

v1::KvDtype DtypeToProto(DType dtype);
// InvalidArgument for anything but KV_F32 and KV_F16.
absl::StatusOr<DType> DtypeFromProto(v1::KvDtype dtype);

}  // namespace riskkv
