// Moving a decoding session's state from a source node to a target node as a stream of frames
// (proto/riskkv/v1/migration.proto): a handshake the target checks before any KV moves, KV
// chunks of bounded size with a CRC-32C each, and a trailer with totals. Transport-free: the
// node services carry the frames over gRPC; tests carry them in memory.
//
// A session's state is its token ids, its sampler (parameters and RNG state) and the KV of every
// token but the last: the last sampled token has not been fed yet, and feeding it is the target's
// first decode step, which yields the logits of the next token.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/gpu_model.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/model/sampler.h"
#include "common/recovery/gpu_rebuild.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"
#include "riskkv/v1/migration.pb.h"

namespace riskkv {

inline constexpr uint32_t kMigrationProtocolVersion = 1;

enum class MigrationMode { kReconstruct, kFullKv, kTokenReplay };
const char* MigrationModeName(MigrationMode mode);  // "reconstruct", "full_kv", "token_replay"
v1::MigrationMode ToProto(MigrationMode mode);
absl::StatusOr<MigrationMode> FromProto(v1::MigrationMode mode);

// The source's view of a session at the moment it migrates.
struct SessionView {
  const KvCache* cache = nullptr;    // rows [0, tokens.size() - 1) hold the history's KV (a
                                     // row for the last token too is allowed and not sent)
  std::span<const int32_t> tokens;   // every token so far; the last one not fed yet
  const Sampler* sampler = nullptr;  // parameters and RNG state
};

// The layers a mode sends, in sending order. RECONSTRUCT sends the policy's kept layers with the
// anchors of rebuilt groups first, group by group in layer order, so the target can rebuild each
// group as soon as its anchors have arrived; the other kept layers follow in ascending order.
// FULL_KV sends every layer in ascending order; TOKEN_REPLAY none.
std::vector<int32_t> SendOrder(MigrationMode mode, int64_t n_layers, const RetentionPolicy* policy);

struct SendOptions {
  MigrationMode mode = MigrationMode::kFullKv;
  std::string model_fingerprint;
  const RetentionPolicy* policy = nullptr;  // required for RECONSTRUCT
  int64_t max_chunk_bytes = 256 << 10;      // payload bound of one chunk (>= one row)
};

// The handshake for `session` (checks the view is consistent: tokens - 1 or tokens cache rows).
absl::StatusOr<v1::MigrationHandshake> MakeHandshake(const SessionView& session,
                                                     const SendOptions& options);

// Emits the KV chunks the handshake announced and then the trailer. A sink error stops the
// stream and is returned.
using FrameSink = std::function<absl::Status(v1::MigrationFrame frame)>;
absl::Status SendKv(const SessionView& session, const v1::MigrationHandshake& handshake,
                    const SendOptions& options, const FrameSink& sink);

// What the target needs to accept migrations.
struct TargetContext {
  Model* model = nullptr;
  std::string model_fingerprint;
  const RetentionPolicy* policy = nullptr;  // for RECONSTRUCT
  const PredictorBank* bank = nullptr;      // the policy's bank
  // The bank's predictor for each of the policy's rebuilt groups, in its order (Retention::groups).
  const std::vector<const FoldedGroup*>* groups = nullptr;
  int64_t capacity = 0;  // KV rows of the resumed session (0: context)
  // Held while the receiver runs the model (rebuild, prefill, first decode step), when the model
  // is shared with other work; receiving and checking chunks does not take it.
  std::mutex* model_mutex = nullptr;
  // When set, the session resumes on the GPU: chunks are uploaded as they arrive (f16), groups
  // are rebuilt there once their anchors land, and the prefill or first decode step runs there.
  GpuModel* gpu = nullptr;
  const GpuPredictors* gpu_predictors = nullptr;  // of `bank`, for RECONSTRUCT on the GPU
};

struct ResumedSession {
  MigrationMode mode = MigrationMode::kFullKv;
  std::unique_ptr<KvCache> cache;   // rows [0, tokens.size()); null when resumed on the GPU
  std::unique_ptr<GpuSession> gpu;  // the KV when the target resumed on the GPU
  std::vector<int32_t> tokens;
  std::optional<Sampler> sampler;  // restored from the handshake (set once resumed)
  std::vector<float> logits;       // of the next token, after feeding the last one
  int64_t kv_bytes_received = 0;
  double rebuild_seconds = 0.0;  // RECONSTRUCT
  double prefill_seconds = 0.0;  // TOKEN_REPLAY
};

// The target's side of one migration: feed it the frames in order. Errors leave the receiver
// unusable (the caller drops it); nothing it built is visible before OnTrailer succeeds.
class MigrationReceiver {
 public:
  explicit MigrationReceiver(TargetContext context);

  // Checks compatibility before any KV moves. FailedPrecondition names what does not match
  // (protocol version, model fingerprint, policy id or version, bank, layer list); InvalidArgument
  // for a malformed handshake (bad session state, sizes, dtype, mode).
  absl::Status OnHandshake(const v1::MigrationHandshake& handshake);
  // DataLoss for a CRC mismatch; InvalidArgument for a chunk out of sequence, for a layer not
  // announced, rows outside the history, a wrong payload size or rows sent twice.
  absl::Status OnChunk(const v1::KvChunk& chunk);
  // DataLoss when the totals disagree or announced rows are missing; then rebuilds what remains
  // (RECONSTRUCT) or prefills the history (TOKEN_REPLAY) and feeds the last token.
  absl::StatusOr<ResumedSession> OnTrailer(const v1::MigrationTrailer& trailer);
  // Dispatches a frame to the three above; a second handshake or a frame after the trailer is
  // FailedPrecondition.
  absl::Status OnFrame(const v1::MigrationFrame& frame);
  // Set by OnFrame when the trailer arrived and the session resumed.
  absl::StatusOr<ResumedSession> TakeResumed();

 private:
  absl::Status RebuildReadyGroups();
  // Writes a verified chunk's rows into the host cache or queues them for the GPU.
  absl::Status StoreRows(int32_t layer, bool values, int64_t first, int64_t n,
                         const uint8_t* bytes);
  std::unique_lock<std::mutex> LockModel() const;  // an empty lock without a model_mutex

  enum class Stage { kHandshake, kChunks, kDone, kFailed };
  TargetContext ctx_;
  Stage stage_ = Stage::kHandshake;
  v1::MigrationHandshake handshake_;
  ResumedSession session_;
  int64_t history_ = 0;
  int64_t row_bytes_ = 0;  // one token's K (or V) of one layer on the wire
  DType wire_dtype_ = DType::kF16;
  std::vector<float> f32_rows_;     // an f32 chunk, aligned, on its way to the GPU
  std::vector<uint16_t> f16_rows_;  // the same converted to the GPU cache's f16
  int64_t next_sequence_ = 0;
  uint32_t crc_of_crcs_ = 0;
  std::vector<std::vector<bool>> rows_done_;  // [layer * 2 + values][row]
  std::vector<int64_t> rows_left_;            // per layer: K and V rows still missing
  std::vector<bool> announced_;               // per layer
  std::vector<const FoldedGroup*> pending_;   // rebuilt groups not yet rebuilt
  std::unique_ptr<absl::StatusOr<ResumedSession>> resumed_;
};

}  // namespace riskkv
