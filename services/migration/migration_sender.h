// The source's side of one migration as a state machine with no transport inside: it builds the
// handshake, reads the target's replies, emits the KV chunks in sending order and the trailer,
// then commits the hand-over, withdrawing the session from service and putting it back when the
// target does not confirm. The node carries its frames over a gRPC stream; tests carry them in
// memory to a MigrationReceiver.
//
//   Handshake() -> frame        state kStart -> kAwaitAccepted
//   OnReply(accepted)           -> kStreaming
//   NextFrame() ... -> chunks, then the trailer, then nullopt      -> kAwaitResumed
//   OnReply(resumed)            -> kResumed
//   Commit() -> frame (HandOver::Withdraw)                         -> kAwaitCommitted
//   OnReply(committed)          -> kCommitted (the target serves the session)
//
// A live migration (SendOptions::live) streams the rows in pre-copy rounds while the session keeps
// decoding on the source:
//
//   NextFrame() ... -> a round's chunks, then its PrecopyRound frame, then nullopt
//                                                                  -> kAwaitRoundDone
//   OnReply(round_done)         -> kRoundDone
//   ShouldPause(history now)    the caller asks whether to pause now
//   AwaitGroupEnd(history now)  and, in a quantized form, whether a round to the next whole
//                               token group is worth waiting for first
//   NextRound(tokens now)       -> kStreaming (another round), or
//   Pause(tokens, sampler)      -> kStreaming (the rows added since the last round, then the
//                                  trailer with the session's final state) -> kAwaitResumed
//
// The session's store must hold rows [0, tokens - 1) for the tokens each call passes; rows below
// that are never changed by the session while it decodes on (it only appends).
//
// An error from the target or the store, and Abort(), move to kFailed; from kAwaitCommitted that
// calls HandOver::Restore first, so a failed migration always leaves the session on the source,
// intact. A call out of order is FailedPrecondition and changes nothing.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/engine.h"
#include "common/kvcodec/wire_form.h"
#include "common/model/sampler.h"
#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"
#include "riskkv/v1/migration.pb.h"
#include "services/migration/migration_mode.h"

namespace riskkv {

// The source's view of a session at the moment it migrates.
struct SessionView {
  const KvStore* kv = nullptr;       // rows [0, tokens.size() - 1) hold the history's KV (a row
                                     // for the last token too is allowed and not sent)
  std::span<const int32_t> tokens;   // every token so far; the last one not fed yet
  const Sampler* sampler = nullptr;  // parameters and RNG state
};

struct SendOptions {
  MigrationMode mode = MigrationMode::kFullKv;
  std::string model_fingerprint;
  // Names the migration in its handshake, so the source can ask the target for the outcome
  // (empty: none).
  std::string migration_id = {};
  // The identity that owns the session (empty: none); the target registers it under the same.
  std::string owner = {};
  const RetentionPolicy* policy = nullptr;  // required for RECONSTRUCT
  // The policy's bank: required for RECONSTRUCT in the transform form, whose transforms it holds.
  const PredictorBank* bank = nullptr;
  // The form FULL_KV sends the rows in (plain, int8 or int4); RECONSTRUCT sends its policy's
  // (PolicyWireForm) and TOKEN_REPLAY none.
  WireForm wire_form = WireForm::kPlain;
  // Payload bound of one chunk: at least one row (plain) or one token group (MinChunkBytes).
  int64_t max_chunk_bytes = 256 << 10;
  // Called with each chunk's payload bytes before the chunk is handed out (the node's link
  // limit waits there); may be null.
  std::function<void(int64_t bytes)> pace;
  // Pre-copy in rounds (see above). The pause comes when a round would carry at most
  // `pause_rows` rows (TOKEN_REPLAY: at most one token; or none: a quantized round ends on a
  // whole token group), or after `max_rounds` rounds however fast the session grows.
  bool live = false;
  int64_t pause_rows = 4;
  int max_rounds = 8;
};

// Takes the session out of service at the commit and puts it back if the target does not
// confirm. Both are called at most once each, Restore only after Withdraw.
class HandOver {
 public:
  virtual ~HandOver() = default;
  virtual void Withdraw() = 0;
  virtual void Restore() = 0;
};

class MigrationSender {
 public:
  enum class State {
    kStart,
    kAwaitAccepted,
    kStreaming,
    kAwaitRoundDone,
    kRoundDone,
    kAwaitResumed,
    kResumed,
    kAwaitCommitted,
    kCommitted,
    kFailed
  };

  // `session`'s store and `hand_over` must stay valid while the sender runs; its tokens and
  // sampler are read by Handshake only (a live migration passes the later ones to NextRound and
  // Pause). Stop-and-copy needs the store unchanged until the commit; `hand_over` may be null
  // (nothing to withdraw).
  MigrationSender(SessionView session, SendOptions options, HandOver* hand_over);

  // The first frame. InvalidArgument when the view is inconsistent (no store, sampler or tokens;
  // not tokens - 1 or tokens rows; max_chunk_bytes under MinChunkBytes); FailedPrecondition for
  // RECONSTRUCT without a policy; the store's error when its rows cannot be read
  // (KvStore::PrepareRead).
  absl::StatusOr<v1::MigrationFrame> Handshake();
  // A reply from the target: `accepted` in kAwaitAccepted, `round_done` (naming the round's
  // history) in kAwaitRoundDone, `resumed` in kAwaitResumed, `committed` in kAwaitCommitted.
  // Any other reply is FailedPrecondition ("out of protocol").
  absl::Status OnReply(const v1::ReceiveReply& reply);
  // In kStreaming: the next chunk (rows read from the store, encoded), then the trailer (or, in a
  // live pre-copy round, the round's PrecopyRound); after it nullopt, and the sender waits for
  // the target's reply. Errors reading the store are returned.
  absl::StatusOr<std::optional<v1::MigrationFrame>> NextFrame();
  // In kRoundDone: whether to pause with the session at `history_tokens` rows (see
  // SendOptions::live).
  bool ShouldPause(int64_t history_tokens) const;
  // In kRoundDone, once ShouldPause(history_tokens) said yes: a quantized round ends on a whole
  // token group, so more than `pause_rows` rows past the last round may be left to the pause.
  // Then, once per migration and within the rounds cap, the history at the next group's end:
  // a session still generating reaches it soon, and a round to it leaves the pause only the
  // rows generated while that round is sent. 0 when the pause should come now.
  int64_t AwaitGroupEnd(int64_t history_tokens);
  // In kRoundDone: another round, up to the rows of `tokens` (the session's tokens now, which
  // extend those already sent). InvalidArgument when they do not.
  absl::Status NextRound(std::span<const int32_t> tokens);
  // In kRoundDone, with the session paused: the last rows, then the trailer carrying `tokens`
  // (every token of the session) and the sampler's state.
  absl::Status Pause(std::span<const int32_t> tokens, const Sampler& sampler);
  // In kResumed: the commit frame; the session is withdrawn from service first.
  absl::StatusOr<v1::MigrationFrame> Commit();
  // The transport failed or the caller gave up: kFailed, restoring a withdrawn session. A no-op
  // once committed.
  void Abort();
  // In kAwaitCommitted, when the confirmation was lost but the target, asked, says it took the
  // session as `session_id`: kCommitted.
  absl::Status ConfirmCommitted(const std::string& session_id);

  State state() const { return state_; }
  // After Handshake / the matching replies.
  const v1::MigrationHandshake& handshake() const { return handshake_; }
  // The form the chunks carry (plain for TOKEN_REPLAY), once the handshake was built.
  WireForm wire_form() const { return form_; }
  const v1::HandshakeAccepted& accepted() const { return accepted_; }
  const v1::Resumed& resumed() const { return resumed_; }
  const std::string& target_session_id() const { return target_session_id_; }
  // Pre-copy rounds acknowledged, payload bytes sent so far and those sent before Pause.
  int rounds() const { return rounds_; }
  int64_t bytes_sent() const { return bytes_; }
  int64_t bytes_before_pause() const { return bytes_before_pause_; }
  // Rows of the session sent so far (its history at the end).
  int64_t rows_sent() const { return round_end_; }

 private:
  absl::Status Fail(absl::Status status);
  // Starts streaming rows [round_end_, end) of every layer; the tokens past those already sent,
  // up to end + 1 of them, go with the round's frame (or the trailer).
  absl::Status StartRound(std::span<const int32_t> tokens, int64_t end);
  // The rows a pause may leave to the downtime: pause_rows, but at most one in TOKEN_REPLAY,
  // whose target prefills each remaining token while the session waits (a decode step's work
  // where FULL_KV only sends a row).
  int64_t PauseRows() const;
  // The rows a pre-copy round may end on for a session of `history` rows.
  int64_t RoundEnd(int64_t history) const;

  const SessionView session_;
  const SendOptions options_;
  HandOver* const hand_over_;
  State state_ = State::kStart;
  v1::MigrationHandshake handshake_;
  v1::HandshakeAccepted accepted_;
  v1::Resumed resumed_;
  std::string target_session_id_;
  // Streaming position: index into handshake_.layers(), keys then values, first row, within
  // the round's rows [round_begin_, round_end_).
  int layer_index_ = 0;
  bool values_ = false;
  int64_t first_row_ = 0;
  int64_t round_begin_ = 0;
  int64_t round_end_ = 0;
  bool paused_ = false;         // the last rows are streaming: the trailer comes next
  bool awaited_group_ = false;  // AwaitGroupEnd named a group end
  int rounds_ = 0;
  int64_t bytes_before_pause_ = 0;
  std::vector<int32_t> tokens_sent_;   // the tokens the target knows of (live)
  std::vector<int32_t> round_tokens_;  // tokens the current round's frame will add
  v1::DecodingState final_state_;      // what the trailer carries (live)
  int64_t rows_per_chunk_ = 1;
  WireForm form_ = WireForm::kPlain;
  const BankTransforms* transforms_ = nullptr;  // the transform form's
  std::vector<std::array<float, 2>> steps_;     // its step per layer, keys and values
  std::vector<uint8_t> raw_;                    // a coded chunk's rows as the store holds them
  std::vector<float> rows_;                     // and in f32, to encode
  int64_t sequence_ = 0;
  int64_t bytes_ = 0;
  uint32_t crc_of_crcs_ = 0;
};

}  // namespace riskkv
