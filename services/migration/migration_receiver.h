// The target's side of one migration as a state machine with no transport inside: feed it every
// frame in order (handshake, KV chunks, trailer, commit); it answers with the reply to send
// (accepted, resumed, committed). The node carries frames and replies over a gRPC stream; tests
// feed a MigrationSender's frames in memory.
//
// Nothing it builds is visible before the commit: then `adopt` registers the resumed session.
// Every error in a frame leaves the receiver failed (the caller drops it and ends the stream with
// the error); failure_reason() names the kind for metrics. Frames after the commit or a failure
// are FailedPrecondition.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/stopwatch.h"
#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "common/kvcodec/wire_form.h"
#include "common/model/sampler.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"
#include "riskkv/v1/migration.pb.h"
#include "services/migration/migration_mode.h"

namespace riskkv {

// Where the time of a resume went, for the node's metrics and speed estimates.
struct ResumeFigures {
  int64_t history_tokens = 0;
  int64_t kv_bytes_received = 0;
  double rebuild_seconds = 0.0;   // RECONSTRUCT
  double prefill_seconds = 0.0;   // TOKEN_REPLAY
  double recovery_seconds = 0.0;  // handshake received to first token ready
};

// A session rebuilt from a stream, ready to decode on.
struct ResumedSession {
  MigrationMode mode = MigrationMode::kFullKv;
  std::unique_ptr<KvStore> kv;  // rows [0, tokens.size())
  std::vector<int32_t> tokens;
  std::optional<Sampler> sampler;  // restored from the handshake
  std::vector<float> logits;       // of the next token, after feeding the last one
  std::string migration_id;        // the handshake's (empty from a source that names none)
  std::string owner;               // the handshake's: whose session it is
};

// Another configuration of the policy's ladder the target accepts RECONSTRUCT at
// (policy_ladder.h): the policy at that rung, and the bank's predictor for each of its rebuilt
// groups, in its order.
struct TargetRung {
  const RetentionPolicy* policy = nullptr;
  const std::vector<const FoldedGroup*>* groups = nullptr;
};

// What the target needs to accept migrations.
struct TargetContext {
  Engine* engine = nullptr;
  std::string model_fingerprint;
  const RetentionPolicy* policy = nullptr;  // for RECONSTRUCT
  const PredictorBank* bank = nullptr;      // the policy's bank
  // The bank's predictor for each of the policy's rebuilt groups, in its order (matched once,
  // when the policy and bank were paired).
  const std::vector<const FoldedGroup*>* groups = nullptr;
  const EnginePredictors* predictors = nullptr;  // `bank` prepared for `engine`
  // The other rungs of the policy's ladder (their predictors in `bank` too): a RECONSTRUCT
  // handshake may name any of them by its wire form and layers.
  std::vector<TargetRung> rungs;
  int64_t capacity = 0;  // KV rows of the resumed session (0: context)
  // The largest chunk payload accepted (0: no bound); a chunk of one row (plain) or one token
  // group (quantized) is always accepted, as the sender's MinChunkBytes.
  int64_t max_chunk_bytes = 0;
  // Runs the engine's work (rebuilds, replay, the first token) among the node's other work, at a
  // hand-over's priority once the session is paused (a live migration's pre-copy rounds at a
  // prefill's); null: straight on the engine.
  Scheduler* scheduler = nullptr;
  // This node's measured speeds, reported to the source in `accepted` (0: not measured).
  double prefill_seconds_per_token = 0;
  double rebuild_seconds_per_token = 0;
  // Registers the session when the commit arrives and returns its id. Its error fails the
  // commit (ResourceExhausted: the session limit; DeadlineExceeded: too late).
  std::function<absl::StatusOr<std::string>(ResumedSession session)> adopt;
  // Hears where the time of the resume went, once the session resumed (may be null).
  std::function<void(const ResumeFigures& figures)> on_resumed;
};

class MigrationReceiver {
 public:
  explicit MigrationReceiver(TargetContext context);

  // The next frame of the stream, and the reply to send for it, if any:
  // - handshake: checked before any KV moves; replies `accepted`. FailedPrecondition names what
  //   does not match (protocol version, model fingerprint, policy id or version, bank, layer
  //   list, a wire form this node cannot decode or, for RECONSTRUCT, a wire form and layers that
  //   are not the policy's nor those of a rung of its ladder);
  //   InvalidArgument for a malformed handshake (session state, sizes, dtype, mode, a wire form
  //   with TOKEN_REPLAY) or a session that does not fit. A first frame of another kind is
  //   InvalidArgument.
  // - chunk: DataLoss for a CRC mismatch; InvalidArgument for a chunk out of sequence, for a
  //   layer not announced, rows outside the history, a quantized chunk off its token groups, a
  //   payload size other than its form's or above max_chunk_bytes, rows sent twice, or rows that do
  //   not decode (a scale that is not finite, ...: kv_codec.h). Groups are rebuilt as soon as their
  //   anchors are complete.
  // - round (live only): DataLoss unless every announced layer holds exactly the round's rows
  //   (and the first round what the handshake announced); InvalidArgument for a round that goes
  //   back, does not fit, ends inside a token group or brings another number of tokens; then
  //   rebuilds the round's rows (RECONSTRUCT) or prefills its tokens (TOKEN_REPLAY); replies
  //   `round_done`.
  // - trailer: DataLoss when the totals disagree or announced rows are missing; then rebuilds
  //   what remains, replays the history (TOKEN_REPLAY), feeds the last token; replies `resumed`.
  //   A live trailer also carries the tokens since the last round and the sampler's state.
  // - commit: after the trailer only; calls `adopt` and replies `committed` with the id.
  // A second handshake, and a chunk or trailer after the trailer, are FailedPrecondition; a
  // commit before the trailer, and an empty frame anywhere, InvalidArgument.
  absl::StatusOr<std::optional<v1::ReceiveReply>> OnFrame(const v1::MigrationFrame& frame);

  // The stream ended early: the label failure_reason() then gives ("truncated" before the
  // trailer, "not_committed" after it). Nothing was applied.
  void OnStreamEnd();

  // Why the receiver failed, for metrics: "protocol", "handshake", "wire_form" (a handshake
  // refused for its wire form), "corrupt", "bad_chunk", "resume", "session_limit", "timeout",
  // "given_up" (its source asked for the outcome before the commit came),
  // "truncated", "not_committed"; empty while it has not.
  const std::string& failure_reason() const { return failure_; }
  // The mode the handshake named, once it parsed.
  std::optional<MigrationMode> mode() const { return mode_; }
  bool committed() const { return stage_ == Stage::kCommitted; }
  // The KV rows the stream has asked this node to hold so far: the announced history with the
  // row its resume adds, or past it, the highest row a chunk or a round reached (a node's KV
  // budget is charged with them after each frame).
  int64_t rows_reached() const { return rows_reached_; }
  // The handshake's migration id, once a handshake arrived (empty before, and from a source that
  // names none).
  const std::string& migration_id() const { return handshake_.migration_id(); }
  // The id `adopt` gave the session, once committed.
  const std::string& session_id() const { return session_id_; }
  // Set once the session resumed (trailer accepted).
  const ResumeFigures& figures() const { return figures_; }
  // The resumed session between the trailer and the commit (tests look inside).
  const ResumedSession* resumed() const { return resumed_ ? &*resumed_ : nullptr; }

 private:
  enum class Stage { kHandshake, kChunks, kResumed, kCommitted, kFailed };
  absl::Status OnHandshake(const v1::MigrationHandshake& handshake);
  absl::Status OnChunk(const v1::KvChunk& chunk);
  // The transform form's handshake against this node's policy and bank: the codec version, the
  // policy's step ratio and transforms for this model (a refusal otherwise); sets steps_.
  absl::Status CheckTransformHandshake(const v1::MigrationHandshake& h, const RetentionPolicy& p);
  // Whether the handshake's kv_bytes announced `received` (0 in the transform form, whose sizes
  // are not known ahead).
  bool AnnouncedBytes(int64_t received) const;
  absl::Status OnTrailer(const v1::MigrationTrailer& trailer);
  absl::Status OnLiveTrailer(const v1::MigrationTrailer& trailer);
  absl::Status OnRound(const v1::PrecopyRound& round);
  // DataLoss unless every announced layer holds exactly rows [0, end) (live).
  absl::Status CheckRowsThrough(int64_t end) const;
  // Rows [closed_, end) are in: the store marks them, RECONSTRUCT rebuilds them, TOKEN_REPLAY
  // prefills their tokens, at `kind`'s priority.
  absl::Status ApplyRows(int64_t end, WorkKind kind);
  // A group's rebuild of rows [begin, begin + count), or a replay of `tokens` (its time added to
  // the figures' prefill_seconds), on the engine or through the scheduler.
  absl::StatusOr<double> RunRebuild(const FoldedGroup& group, int64_t begin, int64_t count,
                                    WorkKind kind);
  absl::Status RunPrefill(std::span<const int32_t> tokens, WorkKind kind);
  // Waits for the rebuilds, replays what TOKEN_REPLAY has not, feeds the last token.
  absl::Status Resume();
  absl::StatusOr<std::string> OnCommit();
  absl::Status RebuildReadyGroups();
  absl::Status Fail(const char* reason, absl::Status status);

  TargetContext ctx_;
  Stage stage_ = Stage::kHandshake;
  std::string failure_;
  std::string session_id_;
  std::optional<MigrationMode> mode_;
  v1::MigrationHandshake handshake_;
  ResumedSession session_;
  std::optional<ResumedSession> resumed_;
  ResumeFigures figures_;
  Stopwatch since_handshake_;
  int64_t history_ = 0;
  DType wire_dtype_ = DType::kF16;
  WireForm form_ = WireForm::kPlain;
  const char* refusal_ = "handshake";        // the failure reason of a refused handshake
  std::vector<float> rows_;                  // a coded chunk, decoded
  std::vector<std::array<float, 2>> steps_;  // the transform form's step per layer, K and V
  // The most rows a transform-coded chunk may hold where this node bounds chunks (0: no bound).
  int64_t transform_rows_cap_ = 0;
  int64_t next_sequence_ = 0;
  uint32_t crc_of_crcs_ = 0;
  std::vector<std::vector<bool>> rows_done_;  // [layer * 2 + values][row]
  std::vector<int64_t> rows_left_;            // per layer: K and V rows still missing
  std::vector<bool> announced_;               // per layer
  std::vector<const FoldedGroup*> pending_;   // groups not yet rebuilt
  // RECONSTRUCT: the configuration the handshake named (the policy's own or one of ctx_.rungs).
  const RetentionPolicy* policy_ = nullptr;
  bool live_ = false;
  int64_t capacity_ = 0;
  int64_t closed_ = 0;  // live: rows of the rounds applied
  int64_t rows_reached_ = 0;
  int rounds_ = 0;
  int closing_rounds_ = 0;            // pre-copy rounds run at a hand-over's priority
  std::vector<int64_t> tensor_rows_;  // [layer * 2 + values]: rows received
};

}  // namespace riskkv
