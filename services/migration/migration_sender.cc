// The source's side of a migration (see migration_sender.h).
#include "services/migration/migration_sender.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"
#include "common/kvcodec/kv_codec.h"
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
  if (s.kv->n_tokens() != history && s.kv->n_tokens() != history + 1) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("session cache holds ", s.kv->n_tokens(),
                                                        " rows for ", s.tokens.size(), " tokens")));
  }
  if (options_.mode == MigrationMode::kReconstruct && options_.policy == nullptr) {
    return Fail(absl::FailedPreconditionError("RECONSTRUCT needs a retention policy"));
  }
  const ModelConfig& c = s.kv->engine().config();
  const DType dtype = s.kv->dtype();
  form_ = options_.mode == MigrationMode::kReconstruct ? PolicyWireForm(*options_.policy)
          : options_.mode == MigrationMode::kFullKv    ? options_.wire_form
                                                       : WireForm::kPlain;
  const int64_t least = MinChunkBytes(form_, c.n_kv_heads, c.head_dim, dtype);
  if (options_.max_chunk_bytes < least) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("max_chunk_bytes ", options_.max_chunk_bytes, " is less than one ",
                     form_ == WireForm::kPlain ? "row" : "token group", " in ",
                     std::string(WireFormName(form_)), " (", least, " bytes)")));
  }
  // A store on a device copies its rows to host memory here, before the stream opens, so the
  // chunks read from memory and the time on the wire is the wire's.
  if (auto st = s.kv->PrepareRead(history); !st.ok()) return Fail(st);
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
  const std::vector<int32_t> layers = SendOrder(options_.mode, c.n_layers, options_.policy);
  for (int32_t l : layers) h.add_layers(l);
  h.set_history_tokens(history);
  *h.mutable_session() = EncodeDecodingState(s.tokens, *s.sampler);
  rows_per_chunk_ = RowsPerChunk(options_.max_chunk_bytes, form_, c.n_kv_heads, c.head_dim, dtype);
  const int64_t chunks_per_tensor =
      history == 0 ? 0 : (history + rows_per_chunk_ - 1) / rows_per_chunk_;
  const auto n_sent = static_cast<int64_t>(layers.size());
  h.set_chunk_count(2 * chunks_per_tensor * n_sent);
  h.set_kv_bytes(StreamKvBytes(form_, history, n_sent, c.n_kv_heads, c.head_dim, dtype));
  state_ = State::kAwaitAccepted;
  v1::MigrationFrame frame;
  *frame.mutable_handshake() = h;
  return frame;
}

absl::Status MigrationSender::OnReply(const v1::ReceiveReply& reply) {
  switch (state_) {
    case State::kAwaitAccepted:
      if (!reply.has_accepted()) break;
      accepted_ = reply.accepted();
      state_ = State::kStreaming;
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
  if (state_ == State::kAwaitResumed) return std::nullopt;
  if (state_ != State::kStreaming) {
    return absl::FailedPreconditionError("no frames to send before the target accepted");
  }
  const int64_t history = handshake_.history_tokens();
  if (first_row_ >= history && history > 0) {  // the tensor is done: the next one
    first_row_ = 0;
    if (values_) ++layer_index_;
    values_ = !values_;
  }
  v1::MigrationFrame frame;
  if (history == 0 || layer_index_ >= handshake_.layers_size()) {
    frame.mutable_trailer()->set_chunk_count(sequence_);
    frame.mutable_trailer()->set_kv_bytes(bytes_);
    frame.mutable_trailer()->set_crc32c(crc_of_crcs_);
    state_ = State::kAwaitResumed;
    return frame;
  }
  const int32_t layer = handshake_.layers(layer_index_);
  const int64_t n = std::min(rows_per_chunk_, history - first_row_);
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
    Encode(form_, values_, rows_.data(), first_row_, n, mc.n_kv_heads, mc.head_dim, data);
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
