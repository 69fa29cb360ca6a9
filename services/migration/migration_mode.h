// The three ways a session moves between nodes, their names and their wire values.
#pragma once

#include "absl/status/statusor.h"
#include "riskkv/v1/migration.pb.h"

namespace riskkv {

enum class MigrationMode { kReconstruct, kFullKv, kTokenReplay };
const char* MigrationModeName(MigrationMode mode);  // "reconstruct", "full_kv", "token_replay"
v1::MigrationMode ToProto(MigrationMode mode);
// InvalidArgument for AUTO, UNSPECIFIED or an unknown value.
absl::StatusOr<MigrationMode> FromProto(v1::MigrationMode mode);

}  // namespace riskkv
