// The target's side of a migration (see migration_receiver.h).
#include "services/migration/migration_receiver.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"
#include "common/kvcodec/kv_codec.h"
#include "common/kvcodec/transform_codec.h"
#include "common/recovery/retention_policy.h"
#include "services/access/access_list.h"
#include "services/migration/wire.h"
#include "services/session_codec.h"

namespace riskkv {
namespace {

absl::Status Refuse(const std::string& m) { return absl::FailedPreconditionError(m); }

// A pre-copy round of at most this many rows is one of the last before the pause: the source
// pauses once a round would carry its pause rows or fewer, and every millisecond a busy target
// makes such a round wait, the session grows at the source. It runs at a hand-over's priority
// (between the layers of the step in flight), so the rounds shrink to the pause on a busy node
// as they do on an idle one; larger rounds are a prefill's, and so are closing rounds past the
// first kMostClosingRounds (the source's round cap is its own setting: a peer that keeps
// sending small rounds does not keep the priority).
constexpr int64_t kClosingRoundRows = 16;
constexpr int kMostClosingRounds = 8;

}  // namespace

MigrationReceiver::MigrationReceiver(TargetContext context) : ctx_(std::move(context)) {}

absl::Status MigrationReceiver::Fail(const char* reason, absl::Status status) {
  stage_ = Stage::kFailed;
  failure_ = reason;
  resumed_.reset();
  return status;
}

void MigrationReceiver::OnStreamEnd() {
  if (stage_ == Stage::kCommitted || stage_ == Stage::kFailed) return;
  (void)Fail(stage_ == Stage::kResumed ? "not_committed" : "truncated", absl::OkStatus());
}

absl::StatusOr<std::optional<v1::ReceiveReply>> MigrationReceiver::OnFrame(
    const v1::MigrationFrame& frame) {
  using F = v1::MigrationFrame;
  if (stage_ == Stage::kFailed || stage_ == Stage::kCommitted) {
    return absl::FailedPreconditionError("the migration stream already ended");
  }
  v1::ReceiveReply reply;
  switch (frame.frame_case()) {
    case F::kHandshake:
      if (stage_ != Stage::kHandshake) {
        return Fail("protocol", Refuse("a second handshake in one migration stream"));
      }
      if (auto st = OnHandshake(frame.handshake()); !st.ok()) return Fail(refusal_, st);
      reply.mutable_accepted()->set_prefill_seconds_per_token(ctx_.prefill_seconds_per_token);
      reply.mutable_accepted()->set_rebuild_seconds_per_token(ctx_.rebuild_seconds_per_token);
      return reply;
    case F::kChunk:
    case F::kTrailer:
      if (stage_ == Stage::kHandshake) {
        return Fail("protocol", absl::InvalidArgumentError("the first frame must be a handshake"));
      }
      if (stage_ != Stage::kChunks) {
        return Fail("protocol", Refuse("after the trailer only a commit may come; the resumed "
                                       "session was dropped"));
      }
      if (frame.has_chunk()) {
        if (auto st = OnChunk(frame.chunk()); !st.ok()) {
          return Fail(st.code() == absl::StatusCode::kDataLoss ? "corrupt" : "bad_chunk", st);
        }
        return std::nullopt;
      }
      RETURN_IF_ERROR(OnTrailer(frame.trailer()));  // sets its own failure reason
      reply.mutable_resumed()->set_rebuild_seconds(figures_.rebuild_seconds);
      reply.mutable_resumed()->set_prefill_seconds(figures_.prefill_seconds);
      reply.mutable_resumed()->set_recovery_seconds(figures_.recovery_seconds);
      return reply;
    case F::kRound: {
      if (stage_ == Stage::kHandshake) {
        return Fail("protocol", absl::InvalidArgumentError("the first frame must be a handshake"));
      }
      if (stage_ != Stage::kChunks || !live_) {
        return Fail("protocol", Refuse(stage_ != Stage::kChunks
                                           ? "a pre-copy round after the trailer"
                                           : "a pre-copy round in a stop-and-copy migration"));
      }
      RETURN_IF_ERROR(OnRound(frame.round()));  // sets its own failure reason
      reply.mutable_round_done()->set_history_tokens(closed_);
      return reply;
    }
    case F::kCommit: {
      if (stage_ != Stage::kResumed) {
        return Fail("protocol", absl::InvalidArgumentError(stage_ == Stage::kHandshake
                                                               ? "the first frame must be a "
                                                                 "handshake"
                                                               : "commit before trailer"));
      }
      ASSIGN_OR_RETURN(std::string id, OnCommit());
      reply.mutable_committed()->set_session_id(id);
      return reply;
    }
    default:
      return Fail("protocol", absl::InvalidArgumentError("an empty migration frame"));
  }
}

absl::Status MigrationReceiver::OnHandshake(const v1::MigrationHandshake& h) {
  since_handshake_ = Stopwatch();
  // Known as early as it parses, for the metrics of a refusal on any ground; a mode that does
  // not parse is reported after the protocol and model checks.
  const absl::StatusOr<MigrationMode> mode = FromProto(h.mode());
  if (mode.ok()) mode_ = *mode;
  const ModelConfig& c = ctx_.engine->config();
  if (h.protocol_version() != kMigrationProtocolVersion) {
    return Refuse(absl::StrCat("protocol version ", h.protocol_version(), " is not ",
                               kMigrationProtocolVersion));
  }
  if (h.model_fingerprint() != ctx_.model_fingerprint) {
    return Refuse("model fingerprint " + h.model_fingerprint() + " is not this node's " +
                  ctx_.model_fingerprint);
  }
  if (!mode.ok()) return mode.status();
  session_.mode = *mode;
  absl::StatusOr<WireForm> form = WireFormFromProto(h.wire_form());
  if (!form.ok()) {
    refusal_ = "wire_form";
    return Refuse(std::string(form.status().message()));
  }
  form_ = *form;
  if (session_.mode == MigrationMode::kTokenReplay &&
      h.wire_form() != v1::KV_WIRE_FORM_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("TOKEN_REPLAY sends no KV, yet the handshake names wire form ",
                     std::string(WireFormName(form_))));
  }
  if (form_ == WireForm::kTransform && session_.mode != MigrationMode::kReconstruct) {
    return absl::InvalidArgumentError(absl::StrCat(
        MigrationModeName(session_.mode),
        " names the transform wire form, which only RECONSTRUCT sends (with its policy's bank)"));
  }
  ASSIGN_OR_RETURN(DType dtype, DtypeFromProto(h.kv_dtype()));
  ASSIGN_OR_RETURN(DecodingState state, DecodeDecodingState(h.session()));
  history_ = h.history_tokens();
  if (state.token_ids.empty() || history_ != static_cast<int64_t>(state.token_ids.size()) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("history_tokens ", history_, " with ", state.token_ids.size(), " token ids"));
  }
  RETURN_IF_ERROR(ctx_.engine->CheckTokenIds(state.token_ids));
  const int64_t capacity =
      std::min(ctx_.capacity > 0 ? ctx_.capacity : c.context_length, c.context_length);
  capacity_ = capacity;
  live_ = h.live();
  RETURN_IF_ERROR(CheckMigrationId(h.migration_id(), /*required=*/false));
  session_.migration_id = h.migration_id();
  if (!h.owner().empty() && !ValidIdentity(h.owner())) {
    return absl::InvalidArgumentError(absl::StrCat("owner '", h.owner().substr(0, 140),
                                                   "' is not an identity (1-128 of ",
                                                   "[A-Za-z0-9._@-])"));
  }
  session_.owner = h.owner();
  if (history_ + 1 > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session of ", history_ + 1, " tokens does not fit this node's ", capacity, "-row cache"));
  }
  rows_reached_ = history_ + 1;
  // The layers must be exactly what this node expects for the mode (and, for RECONSTRUCT, the
  // rung).
  const std::vector<int32_t> got(h.layers().begin(), h.layers().end());
  std::vector<int32_t> got_sorted = got;
  std::sort(got_sorted.begin(), got_sorted.end());
  auto expected_layers = [&](const RetentionPolicy* policy) {
    std::vector<int32_t> layers = SendOrder(session_.mode, c.n_layers, policy);
    std::sort(layers.begin(), layers.end());
    return layers;
  };
  if (session_.mode == MigrationMode::kReconstruct) {
    const RetentionPolicy* p = ctx_.policy;
    // A policy that rebuilds nothing (its gate fell back to exact KV) needs no bank.
    if (p == nullptr ||
        (!p->rebuilt_groups.empty() && (ctx_.bank == nullptr || ctx_.groups == nullptr ||
                                        ctx_.groups->size() != p->rebuilt_groups.size()))) {
      return Refuse("this node has no retention policy and bank for RECONSTRUCT");
    }
    if (h.policy_id() != p->policy_id || h.policy_version() != p->version) {
      return Refuse(absl::StrCat("policy ", h.policy_id(), " version ", h.policy_version(),
                                 " is not this node's ", p->policy_id, " version ", p->version));
    }
    const std::string mine = ctx_.bank ? ctx_.bank->content_hash() : p->predictor_bank_sha256;
    if (h.predictor_bank_sha256() != mine) {
      return Refuse("predictor bank " + h.predictor_bank_sha256() + " is not this node's " +
                    (mine.empty() ? std::string("(none)") : mine));
    }
    // The rung the handshake names, by its form and layers: the policy's own configuration or
    // another of its ladder.
    auto sends = [&](const RetentionPolicy& rung) { return expected_layers(&rung) == got_sorted; };
    policy_ = p;
    const std::vector<const FoldedGroup*>* groups = ctx_.groups;
    bool form_listed = form_ == PolicyWireForm(*p);
    if (!(form_listed && sends(*p))) {
      for (const TargetRung& rung : ctx_.rungs) {
        if (PolicyWireForm(*rung.policy) != form_) continue;
        form_listed = true;
        if (sends(*rung.policy) && rung.groups != nullptr &&
            rung.groups->size() == rung.policy->rebuilt_groups.size()) {
          policy_ = rung.policy;
          groups = rung.groups;
          break;
        }
      }
    }
    if (!form_listed) {
      refusal_ = "wire_form";
      return Refuse(absl::StrCat("wire form ", std::string(WireFormName(form_)), " is not the ",
                                 std::string(WireFormName(PolicyWireForm(*p))), " that policy ",
                                 p->Name(),
                                 " was calibrated for, nor that of a rung of its ladder"));
    }
    if (form_ == WireForm::kTransform) RETURN_IF_ERROR(CheckTransformHandshake(h, *policy_));
    if (groups != nullptr) pending_.assign(groups->begin(), groups->end());
    if (!pending_.empty() &&
        (ctx_.predictors == nullptr || &ctx_.predictors->bank() != ctx_.bank)) {
      return Refuse("this node's predictor bank is not loaded on its " +
                    std::string(ctx_.engine->backend()) + " engine");
    }
  }
  if (const std::vector<int32_t> expected_sorted = expected_layers(policy_);
      got_sorted != expected_sorted) {
    return Refuse(absl::StrCat(MigrationModeName(session_.mode), " should send layers [",
                               absl::StrJoin(expected_sorted, ","), "], the handshake lists [",
                               absl::StrJoin(got_sorted, ","), "]"));
  }
  wire_dtype_ = dtype;
  const auto n_sent = static_cast<int64_t>(got.size());
  const int64_t expect_bytes =
      StreamKvBytes(form_, history_, n_sent, c.n_kv_heads, c.head_dim, dtype);
  // Every chunk but a layer's last holds at least one row (plain) or token group.
  const int64_t unit = ChunkRowUnit(form_);
  const int64_t max_chunks = 2 * n_sent * ((history_ + unit - 1) / unit);
  if (h.kv_bytes() != expect_bytes || h.chunk_count() < 0 ||
      (history_ > 0 && n_sent > 0 && h.chunk_count() < 2 * n_sent) ||
      h.chunk_count() > max_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("handshake announces ", h.chunk_count(),
                                                   " chunks of ", h.kv_bytes(), " bytes; ",
                                                   expect_bytes, " bytes expected"));
  }
  ASSIGN_OR_RETURN(session_.kv, ctx_.engine->NewStore(capacity));
  // Rows arrive into [0, history); a replay prefills them instead.
  if (session_.mode != MigrationMode::kTokenReplay) {
    RETURN_IF_ERROR(session_.kv->SetTokens(history_));
  }
  announced_.assign(c.n_layers, false);
  rows_left_.assign(c.n_layers, 0);
  rows_done_.assign(2 * c.n_layers, {});
  tensor_rows_.assign(2 * c.n_layers, 0);
  for (int32_t l : got) {
    announced_[l] = true;
    rows_left_[l] = 2 * history_;
    rows_done_[2 * l].assign(history_, false);
    rows_done_[2 * l + 1].assign(history_, false);
  }
  closed_ = 0;
  session_.tokens = std::move(state.token_ids);
  session_.sampler = std::move(state.sampler);
  handshake_ = h;
  figures_.history_tokens = history_;
  stage_ = Stage::kChunks;
  // Groups whose anchors carry no rows (empty history); a live migration rebuilds by round.
  return live_ ? absl::OkStatus() : RebuildReadyGroups();
}

absl::Status MigrationReceiver::CheckTransformHandshake(const v1::MigrationHandshake& h,
                                                        const RetentionPolicy& p) {
  refusal_ = "wire_form";
  if (h.transform_codec_version() != kTransformCodecVersion) {
    return Refuse(absl::StrCat("transform codec version ", h.transform_codec_version(),
                               " is not the ", kTransformCodecVersion, " this node decodes"));
  }
  if (h.transform_step() != p.transform_step) {
    return Refuse(absl::StrCat("transform step ", h.transform_step(), " is not the ",
                               p.transform_step, " of policy ", p.Name()));
  }
  const ModelConfig& c = ctx_.engine->config();
  if (absl::Status st = CheckTransforms(ctx_.bank, c); !st.ok()) {
    return Refuse(std::string(st.message()));
  }
  refusal_ = "handshake";
  transform_rows_cap_ =
      ctx_.max_chunk_bytes > 0
          ? RowsPerChunk(std::max(ctx_.max_chunk_bytes,
                                  MinChunkBytes(form_, c.n_kv_heads, c.head_dim, DType::kF32)),
                         form_, c.n_kv_heads, c.head_dim, DType::kF32)
          : 0;
  steps_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int v = 0; v < 2; ++v) {
      steps_[l][v] = TransformStep(ctx_.bank->transforms()->layers[l][v], p.transform_step);
    }
  }
  return absl::OkStatus();
}

bool MigrationReceiver::AnnouncedBytes(int64_t received) const {
  return handshake_.kv_bytes() == (form_ == WireForm::kTransform ? 0 : received);
}

absl::Status MigrationReceiver::OnChunk(const v1::KvChunk& chunk) {
  if (chunk.sequence() != next_sequence_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", chunk.sequence(), " arrived where ", next_sequence_, " was due"));
  }
  const int32_t layer = chunk.layer();
  if (layer < 0 || layer >= static_cast<int32_t>(announced_.size()) || !announced_[layer]) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk.sequence(), " is for layer ",
                                                   layer,
                                                   ", which the handshake does not announce"));
  }
  const int64_t first = chunk.first_token(), n = chunk.token_count();
  // Stop-and-copy rows lie in the announced history; live ones past the closed rounds, with room
  // for the session's last token (the trailer checks they end where the history does).
  const int64_t low = live_ ? closed_ : 0, high = live_ ? capacity_ - 1 : history_;
  if (first < low || n < 1 || first > high - n) {
    return absl::InvalidArgumentError(
        live_ ? absl::StrCat("chunk ", chunk.sequence(), " has ", n, " rows from row ", first,
                             ", outside rows [", low, ", ", high, ") still to come")
              : absl::StrCat("chunk ", chunk.sequence(), " has ", n, " rows from row ", first,
                             ", outside the history of ", history_));
  }
  if (ChunkRowUnit(form_) != 1 &&
      (first % kTokenGroup != 0 || (n % kTokenGroup != 0 && first + n != history_ && !live_))) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", chunk.sequence(), " has ", n, " rows from row ", first, ": ",
                     std::string(WireFormName(form_)), " chunks hold whole ", kTokenGroup,
                     "-token groups (only a layer's last may be shorter)"));
  }
  const ModelConfig& c = ctx_.engine->config();
  const int64_t size = static_cast<int64_t>(chunk.data().size());
  if (form_ == WireForm::kTransform) {
    // Coded sizes vary: a chunk may not carry more than its rows' bound, nor, where this node
    // bounds chunks, more rows than a chunk within that bound holds, so the rows it decodes to
    // cost what an honest chunk's would.
    if (const int64_t bound = TransformChunkBound(c.kv_width(), first, n); size > bound) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk.sequence(), " carries ", size, " bytes for ", n,
                       " transform-coded rows, above their bound of ", bound));
    }
    if (transform_rows_cap_ > 0 && n > transform_rows_cap_) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk.sequence(), " holds ", n,
                                                     " transform-coded rows, above this node's ",
                                                     transform_rows_cap_, " rows per chunk"));
    }
  } else if (size !=
             EncodedBytes(form_, chunk.values(), first, n, c.n_kv_heads, c.head_dim, wire_dtype_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", chunk.sequence(), " carries ", chunk.data().size(), " bytes for ", n, " rows in ",
        std::string(WireFormName(form_)), "; ",
        EncodedBytes(form_, chunk.values(), first, n, c.n_kv_heads, c.head_dim, wire_dtype_),
        " expected"));
  }
  if (const int64_t bound = std::max(ctx_.max_chunk_bytes,
                                     MinChunkBytes(form_, c.n_kv_heads, c.head_dim, wire_dtype_));
      ctx_.max_chunk_bytes > 0 && size > bound) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk.sequence(), " carries ", size,
                                                   " bytes, above this node's bound of ", bound,
                                                   " bytes per chunk"));
  }
  rows_reached_ = std::max(rows_reached_, first + n);
  const auto* bytes = reinterpret_cast<const uint8_t*>(chunk.data().data());
  const uint32_t crc = Crc32c({bytes, chunk.data().size()});
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("chunk ", chunk.sequence(), " (layer ", layer,
                                            ") fails its CRC-32C: ", crc, " != ", chunk.crc32c()));
  }
  std::vector<bool>& done = rows_done_[2 * layer + (chunk.values() ? 1 : 0)];
  if (static_cast<int64_t>(done.size()) < first + n) done.resize(first + n, false);
  for (int64_t t = first; t < first + n; ++t) {
    if (done[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk.sequence(), " resends row ", t, " of layer ", layer));
    }
  }
  if (form_ == WireForm::kPlain) {
    RETURN_IF_ERROR(session_.kv->WriteRows(layer, chunk.values(), first, n, wire_dtype_, bytes));
  } else {
    // Bounded by the chunk's own size (quantized forms) or this node's rows per chunk (the
    // transform form): the rows it decodes to are no more than an honest chunk's.
    rows_.resize(static_cast<size_t>(n * c.kv_width()));
    const int v = chunk.values() ? 1 : 0;
    if (auto st = form_ == WireForm::kTransform
                      ? DecodeTransformChunk(ctx_.bank->transforms()->layers[layer][v],
                                             steps_[layer][v], chunk.data(), first, n, rows_.data())
                      : Decode(form_, chunk.values(), chunk.data(), first, n, c.n_kv_heads,
                               c.head_dim, rows_.data());
        !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk.sequence(), " (layer ", layer, "): ", st.message()));
    }
    RETURN_IF_ERROR(session_.kv->WriteRows(layer, chunk.values(), first, n, DType::kF32,
                                           reinterpret_cast<const uint8_t*>(rows_.data())));
  }
  std::fill(done.begin() + first, done.begin() + first + n, true);
  tensor_rows_[2 * layer + (chunk.values() ? 1 : 0)] += n;
  rows_left_[layer] -= n;
  crc_of_crcs_ = ExtendWithCrc(crc_of_crcs_, crc);
  figures_.kv_bytes_received += size;
  ++next_sequence_;
  if (live_ || rows_left_[layer] != 0) return absl::OkStatus();
  RETURN_IF_ERROR(session_.kv->FinishLayer(layer));
  return RebuildReadyGroups();
}

absl::Status MigrationReceiver::RebuildReadyGroups() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    const bool ready = std::all_of((*it)->group.anchors.begin(), (*it)->group.anchors.end(),
                                   [&](int32_t a) { return rows_left_[a] == 0; });
    if (!ready) {
      ++it;
      continue;
    }
    if (history_ > 0) {
      ASSIGN_OR_RETURN(double seconds, RunRebuild(**it, 0, history_, WorkKind::kHandOver));
      figures_.rebuild_seconds += seconds;
    }
    it = pending_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status MigrationReceiver::CheckRowsThrough(int64_t end) const {
  for (size_t l = 0; l < announced_.size(); ++l) {
    if (!announced_[l]) continue;
    for (int v = 0; v < 2; ++v) {
      const std::vector<bool>& done = rows_done_[2 * l + v];
      // Rows are never accepted twice, so the count and the extent say the rows are [0, end).
      if (tensor_rows_[2 * l + v] != end || static_cast<int64_t>(done.size()) > end) {
        return absl::DataLossError(absl::StrCat("layer ", l, (v ? " values" : " keys"), " hold ",
                                                tensor_rows_[2 * l + v], " rows where rows [0, ",
                                                end, ") were due"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> MigrationReceiver::RunRebuild(const FoldedGroup& group, int64_t begin,
                                                     int64_t count, WorkKind kind) {
  if (ctx_.scheduler == nullptr) {
    return ctx_.engine->Rebuild(*session_.kv, *ctx_.predictors, group, begin, count);
  }
  double seconds = 0;
  RETURN_IF_ERROR(ctx_.scheduler->Exclusive(kind, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(seconds,
                     ctx_.engine->Rebuild(*session_.kv, *ctx_.predictors, group, begin, count));
    return absl::OkStatus();
  }));
  return seconds;
}

absl::Status MigrationReceiver::RunPrefill(std::span<const int32_t> tokens, WorkKind kind) {
  if (ctx_.scheduler == nullptr) {
    const Stopwatch prefill;
    RETURN_IF_ERROR(ctx_.engine->Prefill(tokens, *session_.kv).status());
    figures_.prefill_seconds += prefill.Seconds();
    return absl::OkStatus();
  }
  // The steps' time, not the wait for them: this node's prefill speed is measured from it.
  return ctx_.scheduler->Forward(kind, *session_.kv, tokens, /*all_logits=*/false, nullptr, nullptr,
                                 &figures_.prefill_seconds);
}

absl::Status MigrationReceiver::ApplyRows(int64_t end, WorkKind kind) {
  if (session_.mode == MigrationMode::kTokenReplay) {
    // Positions [closed_, end) are history tokens the target prefills as they come.
    if (end > closed_) {
      const std::span<const int32_t> tokens(session_.tokens);
      RETURN_IF_ERROR(RunPrefill(tokens.subspan(closed_, end - closed_), kind));
    }
  } else {
    RETURN_IF_ERROR(session_.kv->SetTokens(end));
    for (size_t l = 0; l < announced_.size(); ++l) {
      if (announced_[l]) RETURN_IF_ERROR(session_.kv->FinishLayer(static_cast<int32_t>(l)));
    }
    if (end > closed_) {
      for (const FoldedGroup* g : pending_) {
        ASSIGN_OR_RETURN(double seconds, RunRebuild(*g, closed_, end - closed_, kind));
        figures_.rebuild_seconds += seconds;
      }
    }
  }
  closed_ = end;
  return absl::OkStatus();
}

absl::Status MigrationReceiver::OnRound(const v1::PrecopyRound& round) {
  const int64_t end = round.history_tokens();
  const auto added = static_cast<int64_t>(round.token_ids_size());
  const auto known = static_cast<int64_t>(session_.tokens.size());
  if (end < closed_ || end + 1 > capacity_ || known + added != end + 1) {
    return Fail("bad_chunk",
                absl::InvalidArgumentError(absl::StrCat(
                    "a pre-copy round to row ", end, " with ", added, " new tokens after ", known,
                    " (this node's cache holds ", capacity_, " rows)")));
  }
  if (ChunkRowUnit(form_) != 1 && end % kTokenGroup != 0) {
    return Fail("bad_chunk",
                absl::InvalidArgumentError(absl::StrCat(
                    "a pre-copy round in ", std::string(WireFormName(form_)), " ends at row ", end,
                    ", inside a ", kTokenGroup, "-token group")));
  }
  if (rounds_ == 0 &&
      (next_sequence_ != handshake_.chunk_count() || !AnnouncedBytes(figures_.kv_bytes_received))) {
    return Fail("corrupt", absl::DataLossError(absl::StrCat(
                               "the first round brought ", next_sequence_, " chunks and ",
                               figures_.kv_bytes_received, " bytes; the handshake announced ",
                               handshake_.chunk_count(), " and ", handshake_.kv_bytes())));
  }
  if (auto st = CheckRowsThrough(end); !st.ok()) return Fail("corrupt", st);
  rows_reached_ = std::max(rows_reached_, end + 1);
  const std::vector<int32_t> ids(round.token_ids().begin(), round.token_ids().end());
  if (auto st = ctx_.engine->CheckTokenIds(ids); !st.ok()) return Fail("bad_chunk", st);
  session_.tokens.insert(session_.tokens.end(), ids.begin(), ids.end());
  // Pre-copy: the session still generates at the source, so this is not downtime yet; but a
  // closing round decides how much is left to the downtime.
  const bool closing = end - closed_ <= kClosingRoundRows && closing_rounds_ < kMostClosingRounds;
  closing_rounds_ += closing ? 1 : 0;
  const WorkKind kind = closing ? WorkKind::kHandOver : WorkKind::kPrefill;
  if (auto st = ApplyRows(end, kind); !st.ok()) return Fail("resume", st);
  ++rounds_;
  return absl::OkStatus();
}

absl::Status MigrationReceiver::OnTrailer(const v1::MigrationTrailer& t) {
  // The session is paused at the source from here to its first token's logits: its rebuilds,
  // replay and first token hold the engine back to back.
  const Scheduler::Resuming resuming(ctx_.scheduler);
  if (live_) return OnLiveTrailer(t);
  const int64_t received = figures_.kv_bytes_received;
  if (t.has_session()) {
    return Fail("protocol", absl::InvalidArgumentError(
                                "the trailer of a stop-and-copy migration carries a session"));
  }
  if (t.chunk_count() != next_sequence_ || handshake_.chunk_count() != next_sequence_ ||
      t.kv_bytes() != received || !AnnouncedBytes(received) || t.crc32c() != crc_of_crcs_) {
    return Fail("corrupt", absl::DataLossError(absl::StrCat(
                               "stream ended after ", next_sequence_, " chunks and ", received,
                               " bytes; the handshake announced ", handshake_.chunk_count(),
                               " chunks and ", handshake_.kv_bytes(), " bytes, the trailer ",
                               t.chunk_count(), " and ", t.kv_bytes())));
  }
  for (size_t l = 0; l < rows_left_.size(); ++l) {
    if (rows_left_[l] != 0) {
      return Fail("corrupt", absl::DataLossError(absl::StrCat("layer ", l, " is missing ",
                                                              rows_left_[l], " of its K/V rows")));
    }
  }
  if (auto st = RebuildReadyGroups(); !st.ok()) return Fail("resume", st);
  if (!pending_.empty()) {
    return Fail("resume", absl::InternalError("groups left unrebuilt after every anchor arrived"));
  }
  return Resume();
}

absl::Status MigrationReceiver::OnLiveTrailer(const v1::MigrationTrailer& t) {
  const int64_t received = figures_.kv_bytes_received;
  if (t.chunk_count() != next_sequence_ || t.kv_bytes() != received || t.crc32c() != crc_of_crcs_) {
    return Fail("corrupt",
                absl::DataLossError(absl::StrCat(
                    "stream ended after ", next_sequence_, " chunks and ", received,
                    " bytes; the trailer says ", t.chunk_count(), " and ", t.kv_bytes())));
  }
  if (rounds_ == 0) {
    return Fail("protocol",
                absl::InvalidArgumentError("a live migration's trailer before any pre-copy round"));
  }
  absl::StatusOr<DecodingState> state = DecodeDecodingState(t.session());
  if (!state.ok()) return Fail("bad_chunk", state.status());
  if (t.session().sampling().SerializeAsString() !=
      handshake_.session().sampling().SerializeAsString()) {
    return Fail("bad_chunk",
                absl::InvalidArgumentError("the trailer's sampling differs from the handshake's"));
  }
  if (auto st = ctx_.engine->CheckTokenIds(state->token_ids); !st.ok()) {
    return Fail("bad_chunk", st);
  }
  const int64_t end = static_cast<int64_t>(session_.tokens.size() + state->token_ids.size()) - 1;
  if (end + 1 > capacity_) {
    return Fail("bad_chunk", absl::InvalidArgumentError(absl::StrCat(
                                 "session of ", end + 1, " tokens does not fit this node's ",
                                 capacity_, "-row cache")));
  }
  if (auto st = CheckRowsThrough(end); !st.ok()) return Fail("corrupt", st);
  rows_reached_ = std::max(rows_reached_, end + 1);
  session_.tokens.insert(session_.tokens.end(), state->token_ids.begin(), state->token_ids.end());
  session_.sampler = std::move(state->sampler);
  history_ = end;
  figures_.history_tokens = end;
  // TOKEN_REPLAY's last history tokens are prefilled by the resume.
  if (session_.mode != MigrationMode::kTokenReplay) {
    if (auto st = ApplyRows(end, WorkKind::kHandOver); !st.ok()) return Fail("resume", st);
  }
  pending_.clear();
  return Resume();
}

absl::Status MigrationReceiver::Resume() {
  Engine::PrefillFn prefill;
  if (ctx_.scheduler != nullptr) {
    prefill = [this](std::span<const int32_t> tokens, KvStore& store) {
      return ctx_.scheduler->Prefill(WorkKind::kHandOver, tokens, store);
    };
  }
  auto r = ctx_.engine->Resume(*session_.kv, session_.tokens,
                               /*replay=*/session_.mode == MigrationMode::kTokenReplay, prefill);
  if (!r.ok()) return Fail("resume", r.status());
  if (session_.mode == MigrationMode::kReconstruct) {
    figures_.rebuild_seconds += r->rebuild_seconds;  // what still ran on the device
  }
  figures_.prefill_seconds += r->prefill_seconds;
  session_.logits = std::move(r->logits);
  figures_.recovery_seconds = since_handshake_.Seconds();
  resumed_ = std::move(session_);
  stage_ = Stage::kResumed;
  if (ctx_.on_resumed) ctx_.on_resumed(figures_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MigrationReceiver::OnCommit() {
  if (!ctx_.adopt) {
    return Fail("protocol", absl::FailedPreconditionError("this receiver adopts no sessions"));
  }
  auto id = ctx_.adopt(*std::move(resumed_));
  resumed_.reset();
  if (!id.ok()) {
    const absl::StatusCode code = id.status().code();
    return Fail(code == absl::StatusCode::kDeadlineExceeded     ? "timeout"
                : code == absl::StatusCode::kFailedPrecondition ? "given_up"
                                                                : "session_limit",
                id.status());
  }
  stage_ = Stage::kCommitted;
  session_id_ = *id;
  return id;
}

}  // namespace riskkv
