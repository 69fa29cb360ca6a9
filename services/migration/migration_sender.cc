// The source's side of a migration (see migration_sender.h).
#include "services/migration/migration_sender.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"
#include "common/kvcodec/kv_codec.h"
#include "common/kvcodec/transform_codec.h"
#include "services/migration/wire.h"
#include "services/session_codec.h"

namespace riskkv {

MigrationSender::MigrationSender(SessionView session, SendOptions options, HandOver* hand_over)
    : session_(session), options_(std::move(options)), hand_over_(hand_over) {}

absl::Status MigrationSender::Fail(absl::Status status) {
  Abort();
  return status;
}

void MigrationSender::Abort() {
  if (state_ == State::kCommitted || state_ == State::kFailed) return;
  if (state_ == State::kAwaitCommitted && hand_over_ != nullptr) hand_over_->Restore();
  state_ = State::kFailed;
}

absl::Status MigrationSender::ConfirmCommitted(const std::string& session_id) {
  if (state_ != State::kAwaitCommitted) {
    return absl::FailedPreconditionError("no commit awaits its confirmation");
  }
  target_session_id_ = session_id;
  state_ = State::kCommitted;
  return absl::OkStatus();
}

absl::StatusOr<v1::MigrationFrame> MigrationSender::Handshake() {
  if (state_ != State::kStart) {
    return absl::FailedPreconditionError("the handshake was already built");
  }
  const SessionView& s = session_;
  if (s.kv == nullptr || s.sampler == nullptr || s.tokens.empty()) {
    return Fail(
        absl::InvalidArgumentError("a session to migrate needs a KV store, a sampler and tokens"));
  }
  const auto history = static_cast<int64_t>(s.tokens.size()) - 1;
  // A live session decodes on while its rows are read: its store's own count is not this
  // thread's to read, and the node vouches for the rows of its tokens.
  if (!options_.live && s.kv->n_tokens() != history && s.kv->n_tokens() != history + 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("session cache holds ", s.kv->n_tokens(),
                                                        " rows for ", s.tokens.size(), " tokens")));
  }
  if (options_.mode == MigrationMode::kReconstruct && options_.policy == nullptr) {
    return Fail(absl::FailedPreconditionError("RECONSTRUCT needs a retention policy"));
  }
  if (options_.live && (options_.max_rounds < 1 || options_.pause_rows < 0)) {
    return Fail(
        absl::InvalidArgumentError("a live migration needs max_rounds >= 1 and "
                                   "pause_rows >= 0"));
  }
  const ModelConfig& c = s.kv->engine().config();
  const DType dtype = s.kv->dtype();
  form_ = options_.mode == MigrationMode::kReconstruct ? PolicyWireForm(*options_.policy)
          : options_.mode == MigrationMode::kFullKv    ? options_.wire_form
                                                       : WireForm::kPlain;
  if (form_ == WireForm::kTransform) {
    if (options_.mode != MigrationMode::kReconstruct) {
      return Fail(absl::InvalidArgumentError(
          "FULL_KV sends plain, int8 or int4: the transform form comes with a retention policy "
          "(RECONSTRUCT)"));
    }
    if (auto st = CheckTransforms(options_.bank, c); !st.ok()) return Fail(st);
    transforms_ = options_.bank->transforms();
    steps_.resize(static_cast<size_t>(c.n_layers));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        steps_[l][v] = TransformStep(transforms_->layers[l][v], options_.policy->transform_step);
      }
    }
  }
  const int64_t least = MinChunkBytes(form_, c.n_kv_heads, c.head_dim, dtype);
  if (options_.max_chunk_bytes < least) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("max_chunk_bytes ", options_.max_chunk_bytes, " is less than one ",
                     ChunkRowUnit(form_) == 1 ? "row" : "token group", " in ",
                     std::string(WireFormName(form_)), " (", least, " bytes)")));
  }
  // The first round of a live migration ends where a round may; the handshake then names the
  // tokens up to it and the rest follow with later rounds.
  const int64_t first = options_.live ? RoundEnd(history) : history;
  // A store on a device copies its rows to host memory here, before the stream opens, so the
  // chunks read from memory and the time on the wire is the wire's.
  if (auto st = s.kv->PrepareRead(first); !st.ok()) return Fail(st);
  v1::MigrationHandshake& h = handshake_;
  h.set_protocol_version(kMigrationProtocolVersion);
  h.set_model_fingerprint(options_.model_fingerprint);
  h.set_mode(ToProto(options_.mode));
  if (options_.mode == MigrationMode::kReconstruct) {
    h.set_policy_id(options_.policy->policy_id);
    h.set_policy_version(options_.policy->version);
    h.set_predictor_bank_sha256(options_.policy->predictor_bank_sha256);
  }
  h.set_kv_dtype(DtypeToProto(dtype));
  if (options_.mode != MigrationMode::kTokenReplay) h.set_wire_form(WireFormToProto(form_));
  if (form_ == WireForm::kTransform) {
    h.set_transform_step(options_.policy->transform_step);
    h.set_transform_codec_version(kTransformCodecVersion);
  }
  const std::vector<int32_t> layers = SendOrder(options_.mode, c.n_layers, options_.policy);
  for (int32_t l : layers) h.add_layers(l);
  h.set_history_tokens(first);
  h.set_live(options_.live);
  h.set_migration_id(options_.migration_id);
  h.set_owner(options_.owner);
  const std::span<const int32_t> known = s.tokens.first(static_cast<size_t>(first) + 1);
  *h.mutable_session() = EncodeDecodingState(known, *s.sampler);
  tokens_sent_.assign(known.begin(), known.end());
  rows_per_chunk_ = RowsPerChunk(options_.max_chunk_bytes, form_, c.n_kv_heads, c.head_dim, dtype);
  const int64_t chunks_per_tensor =
      first == 0 ? 0 : (first + rows_per_chunk_ - 1) / rows_per_chunk_;
  const auto n_sent = static_cast<int64_t>(layers.size());
  h.set_chunk_count(2 * chunks_per_tensor * n_sent);
  h.set_kv_bytes(StreamKvBytes(form_, first, n_sent, c.n_kv_heads, c.head_dim, dtype));
  round_begin_ = 0;
  round_end_ = first;
  first_row_ = 0;
  paused_ = !options_.live;
  state_ = State::kAwaitAccepted;
  v1::MigrationFrame frame;
  *frame.mutable_handshake() = h;
  return frame;
}

int64_t MigrationSender::RoundEnd(int64_t history) const {
  const int64_t unit = ChunkRowUnit(form_);
  return history / unit * unit;
}

int64_t MigrationSender::PauseRows() const {
  return options_.mode == MigrationMode::kTokenReplay ? std::min<int64_t>(options_.pause_rows, 1)
                                                      : options_.pause_rows;
}

bool MigrationSender::ShouldPause(int64_t history_tokens) const {
  const int64_t more = RoundEnd(history_tokens) - round_end_;
  return rounds_ >= options_.max_rounds || more <= 0 || history_tokens - round_end_ <= PauseRows();
}

int64_t MigrationSender::AwaitGroupEnd(int64_t history_tokens) {
  if (state_ != State::kRoundDone || ChunkRowUnit(form_) == 1 || awaited_group_ ||
      rounds_ >= options_.max_rounds || history_tokens - round_end_ <= PauseRows()) {
    return 0;
  }
  awaited_group_ = true;
  return RoundEnd(history_tokens) + kTokenGroup;
}

absl::Status MigrationSender::StartRound(std::span<const int32_t> tokens, int64_t end) {
  if (tokens.size() < tokens_sent_.size() ||
      !std::equal(tokens_sent_.begin(), tokens_sent_.end(), tokens.begin())) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("the session's ", tokens.size(),
                                                        " tokens do not extend the ",
                                                        tokens_sent_.size(), " already sent")));
  }
  if (auto st = session_.kv->PrepareRead(end); !st.ok()) return Fail(st);
  round_tokens_.assign(tokens.begin() + static_cast<std::ptrdiff_t>(tokens_sent_.size()),
                       tokens.begin() + end + 1);
  tokens_sent_.insert(tokens_sent_.end(), round_tokens_.begin(), round_tokens_.end());
  layer_index_ = 0;
  values_ = false;
  round_begin_ = round_end_;
  round_end_ = end;
  first_row_ = round_begin_;
  state_ = State::kStreaming;
  return absl::OkStatus();
}

absl::Status MigrationSender::NextRound(std::span<const int32_t> tokens) {
  if (state_ != State::kRoundDone) {
    return absl::FailedPreconditionError("another round before the last one was acknowledged");
  }
  if (tokens.empty()) return Fail(absl::InvalidArgumentError("a session without tokens"));
  const int64_t end = std::max(round_end_, RoundEnd(static_cast<int64_t>(tokens.size()) - 1));
  return StartRound(tokens, end);
}

absl::Status MigrationSender::Pause(std::span<const int32_t> tokens, const Sampler& sampler) {
  if (state_ != State::kRoundDone) {
    return absl::FailedPreconditionError("a pause before the last round was acknowledged");
  }
  const auto end = static_cast<int64_t>(tokens.size()) - 1;
  if (end < round_end_) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "the session's ", tokens.size(), " tokens are fewer than the ", round_end_ + 1, " sent")));
  }
  bytes_before_pause_ = bytes_;
  paused_ = true;
  RETURN_IF_ERROR(StartRound(tokens, end));
  final_state_ = EncodeDecodingState(round_tokens_, sampler);
  round_tokens_.clear();
  return absl::OkStatus();
}

absl::Status MigrationSender::OnReply(const v1::ReceiveReply& reply) {
  switch (state_) {
    case State::kAwaitAccepted:
      if (!reply.has_accepted()) break;
      accepted_ = reply.accepted();
      state_ = State::kStreaming;
      return absl::OkStatus();
    case State::kAwaitRoundDone:
      if (!reply.has_round_done() || reply.round_done().history_tokens() != round_end_) break;
      ++rounds_;
      state_ = State::kRoundDone;
      return absl::OkStatus();
    case State::kAwaitResumed:
      if (!reply.has_resumed()) break;
      resumed_ = reply.resumed();
      state_ = State::kResumed;
      return absl::OkStatus();
    case State::kAwaitCommitted:
      if (!reply.has_committed()) break;
      target_session_id_ = reply.committed().session_id();
      state_ = State::kCommitted;
      return absl::OkStatus();
    default:
      break;
  }
  return Fail(absl::FailedPreconditionError("the target answered out of protocol"));
}

absl::StatusOr<std::optional<v1::MigrationFrame>> MigrationSender::NextFrame() {
  if (state_ == State::kAwaitResumed || state_ == State::kAwaitRoundDone) return std::nullopt;
  if (state_ != State::kStreaming) {
    return absl::FailedPreconditionError("no frames to send before the target accepted");
  }
  const int64_t end = round_end_;
  if (first_row_ >= end && end > round_begin_) {  // the tensor is done: the next one
    first_row_ = round_begin_;
    if (values_) ++layer_index_;
    values_ = !values_;
  }
  v1::MigrationFrame frame;
  if (end == round_begin_ || layer_index_ >= handshake_.layers_size()) {
    if (!paused_) {  // a pre-copy round is complete
      frame.mutable_round()->set_history_tokens(end);
      for (int32_t t : round_tokens_) frame.mutable_round()->add_token_ids(t);
      round_tokens_.clear();
      state_ = State::kAwaitRoundDone;
      return frame;
    }
    frame.mutable_trailer()->set_chunk_count(sequence_);
    frame.mutable_trailer()->set_kv_bytes(bytes_);
    frame.mutable_trailer()->set_crc32c(crc_of_crcs_);
    if (options_.live) *frame.mutable_trailer()->mutable_session() = final_state_;
    state_ = State::kAwaitResumed;
    return frame;
  }
  const int32_t layer = handshake_.layers(layer_index_);
  const int64_t n = std::min(rows_per_chunk_, end - first_row_);
  const KvStore& kv = *session_.kv;
  const int64_t row = kv.row_bytes();
  v1::KvChunk* c = frame.mutable_chunk();
  std::string* data = c->mutable_data();
  if (form_ == WireForm::kPlain) {
    // The rows are read straight into the frame: one copy per chunk.
    data->resize(static_cast<size_t>(n * row));
    if (auto st =
            kv.ReadRows(layer, values_, first_row_, n, reinterpret_cast<uint8_t*>(data->data()));
        !st.ok()) {
      return Fail(st);
    }
  } else {
    const ModelConfig& mc = kv.engine().config();
    raw_.resize(static_cast<size_t>(n * row));
    if (auto st = kv.ReadRows(layer, values_, first_row_, n, raw_.data()); !st.ok()) {
      return Fail(st);
    }
    rows_.resize(static_cast<size_t>(n * mc.kv_width()));
    if (kv.dtype() == DType::kF16) {
      F16ToF32Row(reinterpret_cast<const uint16_t*>(raw_.data()), rows_.data(), n * mc.kv_width());
    } else {
      std::memcpy(rows_.data(), raw_.data(), raw_.size());
    }
    if (form_ == WireForm::kTransform) {
      if (auto st = EncodeTransformChunk(transforms_->layers[layer][values_ ? 1 : 0],
                                         steps_[layer][values_ ? 1 : 0], rows_.data(), first_row_,
                                         n, kTransformWireZstdLevel, data);
          !st.ok()) {
        return Fail(st);
      }
    } else {
      Encode(form_, values_, rows_.data(), first_row_, n, mc.n_kv_heads, mc.head_dim, data);
    }
  }
  const auto bytes = static_cast<int64_t>(data->size());
  c->set_sequence(sequence_++);
  c->set_layer(layer);
  c->set_values(values_);
  c->set_first_token(first_row_);
  c->set_token_count(n);
  const uint32_t crc = Crc32c({reinterpret_cast<const uint8_t*>(data->data()), data->size()});
  c->set_crc32c(crc);
  crc_of_crcs_ = ExtendWithCrc(crc_of_crcs_, crc);
  bytes_ += bytes;
  first_row_ += n;
  if (options_.pace) options_.pace(bytes);
  return frame;
}

absl::StatusOr<v1::MigrationFrame> MigrationSender::Commit() {
  if (state_ != State::kResumed) {
    return absl::FailedPreconditionError("a commit before the target resumed the session");
  }
  if (hand_over_ != nullptr) hand_over_->Withdraw();
  state_ = State::kAwaitCommitted;
  v1::MigrationFrame frame;
  frame.mutable_commit();
  return frame;
}

}  // namespace riskkv
