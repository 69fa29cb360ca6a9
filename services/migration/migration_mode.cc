// Migration modes (see migration_mode.h).
#include "services/migration/migration_mode.h"

#include "absl/strings/str_cat.h"

namespace riskkv {

const char* MigrationModeName(MigrationMode mode) {
  switch (mode) {
    case MigrationMode::kReconstruct:
      return "reconstruct";
    case MigrationMode::kFullKv:
      return "full_kv";
    case MigrationMode::kTokenReplay:
      return "token_replay";
  }
  return "?";
}

v1::MigrationMode ToProto(MigrationMode mode) {
  switch (mode) {
    case MigrationMode::kReconstruct:
      return v1::RECONSTRUCT;
    case MigrationMode::kFullKv:
      return v1::FULL_KV;
    case MigrationMode::kTokenReplay:
      return v1::TOKEN_REPLAY;
  }
  return v1::MIGRATION_MODE_UNSPECIFIED;
}

absl::StatusOr<MigrationMode> FromProto(v1::MigrationMode mode) {
  switch (mode) {
    case v1::RECONSTRUCT:
      return MigrationMode::kReconstruct;
    case v1::FULL_KV:
      return MigrationMode::kFullKv;
    case v1::TOKEN_REPLAY:
      return MigrationMode::kTokenReplay;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("migration mode ", static_cast<int>(mode),
                       " is not RECONSTRUCT, FULL_KV or TOKEN_REPLAY"));
  }
}

}  // namespace riskkv
