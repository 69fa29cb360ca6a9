// The predictor bank: every folded map calibrated for one model in one versioned, checksummed,
// memory-mappable file, so a serving process maps it read-only and runs the maps in place.
//
// File format, version 1. All integers little-endian; offsets are from the start of the file.
//   0   char[8]   magic "RKVBANK\0"
//   8   u32       format version (1)
//   12  u32       header bytes: the fixed header, fingerprint and directory, without padding
//   16  u8[32]    checksum: SHA-256 of the whole file with these 32 bytes set to zero
//   48  u64       file bytes (a truncated copy is told apart from a corrupted one)
//   56  u32       dtype of the A matrices: 0 = f32, 1 = f16 (c vectors are always f32)
//   60  u32       group count G
//   64  u32       fingerprint length L (1..1024), then L bytes: the model fingerprint
//       zero padding to a multiple of 8
//   G group records:
//       u32 T (targets), u32 N (anchors), i32 targets[T], i32 anchors[N], zero padding to 8
//       T layer records of 96 bytes, one per target in order:
//         i32 layer, u32 reserved (0), i64 F (features), i64 kv_width, f64 ridge lambda,
//         then (u64 offset, u64 length) of A_k, A_v, c_k, c_v
//   zero padding to 64, then the payload: A_k [kv_width, F] row-major, A_v likewise, c_k
//   [kv_width] f32, c_v likewise, for each layer in directory order, each block starting at a
//   multiple of 64 bytes (zero padding between blocks), the file ending after the last block.
//
// Format version 2 is version 1 with the transform codec's transforms (kv_transform.h) of every
// layer's keys and values: after the group directory,
//       u32 transform kind (0 = PCA, 1 = Hadamard, 2 = identity), u32 layer count L (>= 1),
//       u32 KV heads, u32 head_dim D, then 2 L records of 48 bytes, layer 0's keys, layer 0's
//       values, layer 1's keys, ...: (u64 offset, u64 length) of mean [heads, D] f32, basis
//       [heads, D, D] f32 (head by head, component by component) and variance [heads, D] f32
//   and, in the payload after the maps' blocks, those blocks in the same order. A bank without
//   transforms is written in version 1; this build reads both.
// content_hash() is the hex SHA-256 of the file bytes exactly as written (checksum included),
// i.e. what `sha256sum` prints for the file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kvcodec/kv_transform.h"
#include "common/recovery/folded_map.h"
#include "kernels/dtype.h"

namespace riskkv {

// The transform codec's transforms of every layer of a model, fitted by the calibration.
struct BankTransforms {
  TransformKind kind = TransformKind::kPca;
  std::vector<std::array<LayerTransform, 2>> layers;  // [layer][0: keys, 1: values]
};

class PredictorBank {
 public:
  // The newest version this build writes and reads; a bank without transforms is written in 1.
  static constexpr uint32_t kFormatVersion = 2;

  // Converts fitted maps to `dtype` (kF32 or kF16) and lays them out as the file would be.
  // InvalidArgument when a fit is malformed: layer ids that are not the group's targets in
  // order, targets not ascending and consecutive, a layer in two groups, A/c sizes that are not
  // kv_width*F and kv_width, kv_width differing between layers, non-finite values or values that
  // overflow f16, a negative or non-finite lambda, an empty fingerprint; and `transforms`, when
  // given, without layers, of shapes that differ between layers, or failing CheckTransform.
  static absl::StatusOr<std::unique_ptr<PredictorBank>> FromFits(
      std::string model_fingerprint, DType dtype, const std::vector<GroupFit>& fits,
      const BankTransforms* transforms = nullptr);

  // Maps `path` read-only and validates everything before use (see the format above).
  // FailedPrecondition when `expected_fingerprint` is non-empty and differs from the bank's;
  // DataLoss for a truncated file or a checksum mismatch; InvalidArgument for a malformed one;
  // NotFound / PermissionDenied when it cannot be opened. Errors name the file, what was wrong
  // and the byte offset.
  static absl::StatusOr<std::unique_ptr<PredictorBank>> Open(const std::string& path,
                                                             std::string_view expected_fingerprint);

  // Checks the first bytes of a bank file as they arrive, before the rest does: the magic, the
  // format version, the file size against `file_bytes` (what the sender announced) and the model
  // fingerprint against `expected_fingerprint`, as far as `head` reaches. OK when what it holds
  // agrees (the file may still fail Open); otherwise the error Open would give, naming `source`.
  // Bytes past what it needs are ignored; HeadBytes() is the most it reads.
  static absl::Status CheckHead(std::string_view source, std::string_view head, uint64_t file_bytes,
                                std::string_view expected_fingerprint);
  static uint64_t HeadBytes();

  ~PredictorBank();
  PredictorBank(const PredictorBank&) = delete;
  PredictorBank& operator=(const PredictorBank&) = delete;

  // Replaces `path` with the bank in one step (WriteFileAtomically), so `path` holds either its
  // old content or the whole new bank, also after a crash. Errors as WriteFileAtomically's.
  absl::Status Write(const std::string& path) const;

  const std::string& model_fingerprint() const { return fingerprint_; }
  DType dtype() const { return dtype_; }
  const std::string& content_hash() const { return content_hash_; }
  // Views into the bank's storage, valid as long as the bank.
  const std::vector<FoldedGroup>& groups() const { return groups_; }
  // Bytes of the payload blocks (A_k, A_v, c_k, c_v of every layer), without padding.
  int64_t bytes() const { return payload_bytes_; }
  // The group that rebuilds `layer`, or nullptr when no group targets it.
  const FoldedGroup* FindGroupForLayer(int32_t layer) const;
  // ridge lambda of each map, parallel to groups()[g].maps.
  double ridge_lambda(size_t group, size_t map) const { return lambdas_[group][map]; }
  // The transform codec's transforms (format version 2), or nullptr for a bank without them.
  const BankTransforms* transforms() const { return transforms_ ? &*transforms_ : nullptr; }
  // The transform of `layer`'s keys or values, or nullptr when the bank has none for it.
  const LayerTransform* transform(int32_t layer, bool values) const;

 private:
  class Parser;
  struct Storage;
  PredictorBank();

  // Parses and validates the image held by storage_ and fills the fields below.
  absl::Status Load(std::string_view source, std::string_view expected_fingerprint);
  // Reads a block's (offset, length) record at p: the block must have `expected` bytes, start on
  // kBlockAlign at or after payload_start and payload_end and lie in the file. Advances
  // payload_end past it and returns where it starts.
  absl::StatusOr<const uint8_t*> ReadBlock(Parser& p, const std::string& name, uint64_t expected,
                                           uint64_t payload_start, uint64_t& payload_end);
  // The transform directory of format version 2, at p; kv_width is the maps' (0: no maps).
  absl::Status LoadTransforms(Parser& p, int64_t kv_width, uint64_t payload_start,
                              uint64_t& payload_end);

  std::unique_ptr<Storage> storage_;
  std::string fingerprint_;
  DType dtype_ = DType::kF32;
  std::string content_hash_;
  std::vector<FoldedGroup> groups_;
  std::vector<std::vector<double>> lambdas_;
  std::optional<BankTransforms> transforms_;
  int64_t payload_bytes_ = 0;
};

}  // namespace riskkv
