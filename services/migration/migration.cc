// The migration stream (see migration.h).
#include "services/migration/migration.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/crc32c.h"
#include "common/base/status_macros.h"
#include "common/recovery/rebuild.h"
#include "common/recovery/retention_policy.h"
#include "services/session_codec.h"

namespace riskkv {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

absl::StatusOr<DType> DtypeFromProto(v1::KvDtype d) {
  switch (d) {
    case v1::KV_F32:
      return DType::kF32;
    case v1::KV_F16:
      return DType::kF16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kv_dtype ", static_cast<int>(d), " is not KV_F32 or KV_F16"));
  }
}

uint32_t ExtendWithCrc(uint32_t acc, uint32_t crc) {
  uint8_t le[4] = {static_cast<uint8_t>(crc), static_cast<uint8_t>(crc >> 8),
                   static_cast<uint8_t>(crc >> 16), static_cast<uint8_t>(crc >> 24)};
  return Crc32cExtend(acc, le);
}

// Rows per chunk for a layer whose K (or V) row has `row_bytes` bytes.
int64_t RowsPerChunk(int64_t max_chunk_bytes, int64_t row_bytes) {
  return std::max<int64_t>(1, max_chunk_bytes / row_bytes);
}

}  // namespace

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

std::vector<int32_t> SendOrder(MigrationMode mode, int64_t n_layers,
                               const RetentionPolicy* policy) {
  std::vector<int32_t> order;
  if (mode == MigrationMode::kTokenReplay) return order;
  if (mode == MigrationMode::kFullKv || policy == nullptr) {
    for (int32_t l = 0; l < n_layers; ++l) order.push_back(l);
    return order;
  }
  std::set<int32_t> sent;
  for (const LayerGroup& g : policy->rebuilt_groups) {
    for (int32_t a : g.anchors) {
      if (sent.insert(a).second) order.push_back(a);
    }
  }
  for (int32_t l : policy->kept_layers) {
    if (sent.insert(l).second) order.push_back(l);
  }
  return order;
}

absl::StatusOr<v1::MigrationHandshake> MakeHandshake(const SessionView& s,
                                                     const SendOptions& options) {
  if (s.cache == nullptr || s.sampler == nullptr || s.tokens.empty()) {
    return absl::InvalidArgumentError("a session to migrate needs a cache, a sampler and tokens");
  }
  const auto history = static_cast<int64_t>(s.tokens.size()) - 1;
  if (s.cache->n_tokens() != history && s.cache->n_tokens() != history + 1) {
    return absl::InvalidArgumentError(absl::StrCat("session cache holds ", s.cache->n_tokens(),
                                                   " rows for ", s.tokens.size(), " tokens"));
  }
  if (options.mode == MigrationMode::kReconstruct && options.policy == nullptr) {
    return absl::FailedPreconditionError("RECONSTRUCT needs a retention policy");
  }
  if (options.max_chunk_bytes < s.cache->token_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("max_chunk_bytes ", options.max_chunk_bytes,
                                                   " is less than one row (",
                                                   s.cache->token_bytes(), " bytes)"));
  }
  v1::MigrationHandshake h;
  h.set_protocol_version(kMigrationProtocolVersion);
  h.set_model_fingerprint(options.model_fingerprint);
  h.set_mode(ToProto(options.mode));
  if (options.mode == MigrationMode::kReconstruct) {
    h.set_policy_id(options.policy->policy_id);
    h.set_policy_version(options.policy->version);
    h.set_predictor_bank_sha256(options.policy->predictor_bank_sha256);
  }
  h.set_kv_dtype(s.cache->dtype() == DType::kF16 ? v1::KV_F16 : v1::KV_F32);
  const std::vector<int32_t> layers = SendOrder(options.mode, s.cache->n_layers(), options.policy);
  for (int32_t l : layers) h.add_layers(l);
  h.set_history_tokens(history);
  *h.mutable_session() = EncodeDecodingState(s.tokens, *s.sampler);
  const int64_t per_chunk = RowsPerChunk(options.max_chunk_bytes, s.cache->token_bytes());
  const int64_t chunks_per_tensor = history == 0 ? 0 : (history + per_chunk - 1) / per_chunk;
  h.set_chunk_count(2 * chunks_per_tensor * static_cast<int64_t>(layers.size()));
  h.set_kv_bytes(2 * history * s.cache->token_bytes() * static_cast<int64_t>(layers.size()));
  return h;
}

absl::Status SendKv(const SessionView& s, const v1::MigrationHandshake& h,
                    const SendOptions& options, const FrameSink& sink) {
  const int64_t history = h.history_tokens();
  const int64_t row = s.cache->token_bytes();
  const int64_t per_chunk = RowsPerChunk(options.max_chunk_bytes, row);
  int64_t sequence = 0, bytes = 0;
  uint32_t crc_of_crcs = 0;
  for (int32_t layer : h.layers()) {
    for (bool values : {false, true}) {
      for (int64_t first = 0; first < history; first += per_chunk) {
        const int64_t n = std::min(per_chunk, history - first);
        const uint8_t* src =
            values ? s.cache->ValueRows(layer, first) : s.cache->KeyRows(layer, first);
        v1::MigrationFrame frame;
        v1::KvChunk* c = frame.mutable_chunk();
        c->set_sequence(sequence++);
        c->set_layer(layer);
        c->set_values(values);
        c->set_first_token(first);
        c->set_token_count(n);
        c->set_data(src, static_cast<size_t>(n * row));
        const uint32_t crc = Crc32c({src, static_cast<size_t>(n * row)});
        c->set_crc32c(crc);
        crc_of_crcs = ExtendWithCrc(crc_of_crcs, crc);
        bytes += n * row;
        RETURN_IF_ERROR(sink(std::move(frame)));
      }
    }
  }
  v1::MigrationFrame frame;
  frame.mutable_trailer()->set_chunk_count(sequence);
  frame.mutable_trailer()->set_kv_bytes(bytes);
  frame.mutable_trailer()->set_crc32c(crc_of_crcs);
  return sink(std::move(frame));
}

MigrationReceiver::MigrationReceiver(TargetContext context) : ctx_(std::move(context)) {}

std::unique_lock<std::mutex> MigrationReceiver::LockModel() const {
  return ctx_.model_mutex ? std::unique_lock(*ctx_.model_mutex) : std::unique_lock<std::mutex>();
}

absl::Status MigrationReceiver::OnHandshake(const v1::MigrationHandshake& h) {
  if (stage_ != Stage::kHandshake) {
    return absl::FailedPreconditionError("a second handshake in one migration stream");
  }
  stage_ = Stage::kFailed;  // until everything below holds
  const ModelConfig& c = ctx_.model->config();
  auto refuse = [](const std::string& m) { return absl::FailedPreconditionError(m); };
  if (h.protocol_version() != kMigrationProtocolVersion) {
    return refuse(absl::StrCat("protocol version ", h.protocol_version(), " is not ",
                               kMigrationProtocolVersion));
  }
  if (h.model_fingerprint() != ctx_.model_fingerprint) {
    return refuse("model fingerprint " + h.model_fingerprint() + " is not this node's " +
                  ctx_.model_fingerprint);
  }
  ASSIGN_OR_RETURN(session_.mode, FromProto(h.mode()));
  ASSIGN_OR_RETURN(DType dtype, DtypeFromProto(h.kv_dtype()));
  ASSIGN_OR_RETURN(DecodingState state, DecodeDecodingState(h.session()));
  history_ = h.history_tokens();
  if (state.token_ids.empty() || history_ != static_cast<int64_t>(state.token_ids.size()) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("history_tokens ", history_, " with ", state.token_ids.size(), " token ids"));
  }
  for (int32_t t : state.token_ids) {
    if (t < 0 || t >= c.vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " outside the vocabulary of ", c.vocab));
    }
  }
  const int64_t capacity =
      std::min(ctx_.capacity > 0 ? ctx_.capacity : c.context_length, c.context_length);
  if (history_ + 1 > capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session of ", history_ + 1, " tokens does not fit this node's ", capacity, "-row cache"));
  }
  // The layers must be exactly what this node expects for the mode.
  std::vector<int32_t> expected;
  if (session_.mode == MigrationMode::kReconstruct) {
    const RetentionPolicy* p = ctx_.policy;
    // A policy that rebuilds nothing (its gate fell back to exact KV) needs no bank.
    if (p == nullptr ||
        (!p->rebuilt_groups.empty() && (ctx_.bank == nullptr || ctx_.groups == nullptr ||
                                        ctx_.groups->size() != p->rebuilt_groups.size()))) {
      return refuse("this node has no retention policy and bank for RECONSTRUCT");
    }
    if (h.policy_id() != p->policy_id || h.policy_version() != p->version) {
      return refuse(absl::StrCat("policy ", h.policy_id(), " version ", h.policy_version(),
                                 " is not this node's ", p->policy_id, " version ", p->version));
    }
    const std::string mine = ctx_.bank ? ctx_.bank->content_hash() : p->predictor_bank_sha256;
    if (h.predictor_bank_sha256() != mine) {
      return refuse("predictor bank " + h.predictor_bank_sha256() + " is not this node's " +
                    (mine.empty() ? std::string("(none)") : mine));
    }
    if (ctx_.groups != nullptr) pending_.assign(ctx_.groups->begin(), ctx_.groups->end());
  }
  expected = SendOrder(session_.mode, c.n_layers, ctx_.policy);
  std::vector<int32_t> got(h.layers().begin(), h.layers().end());
  std::vector<int32_t> got_sorted = got, expected_sorted = expected;
  std::sort(got_sorted.begin(), got_sorted.end());
  std::sort(expected_sorted.begin(), expected_sorted.end());
  if (got_sorted != expected_sorted) {
    return refuse(absl::StrCat(MigrationModeName(session_.mode), " should send layers [",
                               absl::StrJoin(expected_sorted, ","), "], the handshake lists [",
                               absl::StrJoin(got_sorted, ","), "]"));
  }
  wire_dtype_ = dtype;
  row_bytes_ = c.kv_width() * (dtype == DType::kF16 ? 2 : 4);
  if (ctx_.gpu != nullptr) {
    if (!pending_.empty() &&
        (ctx_.gpu_predictors == nullptr || &ctx_.gpu_predictors->bank() != ctx_.bank)) {
      return refuse("this node's predictor bank is not loaded on its GPU");
    }
    ASSIGN_OR_RETURN(session_.gpu, ctx_.gpu->NewSession(capacity));
  } else {
    ASSIGN_OR_RETURN(session_.cache,
                     KvCache::Create(c.n_layers, c.n_kv_heads, c.head_dim, capacity, dtype));
  }
  // Rows arrive into [0, history); a replay prefills them instead.
  if (session_.mode != MigrationMode::kTokenReplay) {
    RETURN_IF_ERROR(session_.gpu ? session_.gpu->SetTokens(history_)
                                 : session_.cache->SetTokens(history_));
  }
  const int64_t row = row_bytes_;
  const int64_t expect_bytes = 2 * history_ * row * static_cast<int64_t>(got.size());
  if (h.kv_bytes() != expect_bytes || h.chunk_count() < 0 ||
      (history_ > 0 && !got.empty() && h.chunk_count() < 2 * static_cast<int64_t>(got.size())) ||
      h.chunk_count() > expect_bytes / std::max<int64_t>(row, 1)) {
    return absl::InvalidArgumentError(absl::StrCat("handshake announces ", h.chunk_count(),
                                                   " chunks of ", h.kv_bytes(), " bytes; ",
                                                   expect_bytes, " bytes expected"));
  }
  announced_.assign(c.n_layers, false);
  rows_left_.assign(c.n_layers, 0);
  rows_done_.assign(2 * c.n_layers, {});
  for (int32_t l : got) {
    announced_[l] = true;
    rows_left_[l] = 2 * history_;
    rows_done_[2 * l].assign(history_, false);
    rows_done_[2 * l + 1].assign(history_, false);
  }
  session_.tokens = std::move(state.token_ids);
  session_.sampler = std::move(state.sampler);
  handshake_ = h;
  stage_ = Stage::kChunks;
  return RebuildReadyGroups();  // groups whose anchors carry no rows (empty history)
}

absl::Status MigrationReceiver::OnChunk(const v1::KvChunk& chunk) {
  if (stage_ != Stage::kChunks) {
    return absl::FailedPreconditionError("a KV chunk outside the chunk phase of the stream");
  }
  stage_ = Stage::kFailed;
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
  if (first < 0 || n < 1 || first > history_ - n) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk.sequence(), " has ", n,
                                                   " rows from row ", first,
                                                   ", outside the history of ", history_));
  }
  const int64_t row = row_bytes_;
  if (static_cast<int64_t>(chunk.data().size()) != n * row) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk.sequence(), " carries ",
                                                   chunk.data().size(), " bytes for ", n,
                                                   " rows of ", row));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(chunk.data().data());
  const uint32_t crc = Crc32c({bytes, chunk.data().size()});
  if (crc != chunk.crc32c()) {
    return absl::DataLossError(absl::StrCat("chunk ", chunk.sequence(), " (layer ", layer,
                                            ") fails its CRC-32C: ", crc, " != ", chunk.crc32c()));
  }
  std::vector<bool>& done = rows_done_[2 * layer + (chunk.values() ? 1 : 0)];
  for (int64_t t = first; t < first + n; ++t) {
    if (done[t]) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", chunk.sequence(), " resends row ", t, " of layer ", layer));
    }
    done[t] = true;
  }
  RETURN_IF_ERROR(StoreRows(layer, chunk.values(), first, n, bytes));
  rows_left_[layer] -= n;
  crc_of_crcs_ = ExtendWithCrc(crc_of_crcs_, crc);
  session_.kv_bytes_received += n * row;
  ++next_sequence_;
  stage_ = Stage::kChunks;
  if (rows_left_[layer] != 0) return absl::OkStatus();
  if (session_.gpu) RETURN_IF_ERROR(session_.gpu->MarkLayerUploaded(layer));
  return RebuildReadyGroups();
}

absl::Status MigrationReceiver::StoreRows(int32_t layer, bool values, int64_t first, int64_t n,
                                          const uint8_t* bytes) {
  if (!session_.gpu) {
    uint8_t* dst =
        values ? session_.cache->ValueRows(layer, first) : session_.cache->KeyRows(layer, first);
    std::copy(bytes, bytes + n * row_bytes_, dst);
    return absl::OkStatus();
  }
  if (wire_dtype_ == DType::kF32) {  // the GPU cache is f16; buffers reused chunk after chunk
    const int64_t values_count = n * row_bytes_ / 4;
    f32_rows_.resize(values_count);
    std::memcpy(f32_rows_.data(), bytes, n * row_bytes_);
    f16_rows_.resize(values_count);
    F32ToF16Row(f32_rows_.data(), f16_rows_.data(), values_count);
    bytes = reinterpret_cast<const uint8_t*>(f16_rows_.data());
  }
  return session_.gpu->UploadRows(layer, values, first, n, bytes);
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
      auto lock = LockModel();
      const auto start = Clock::now();  // the rebuild itself, not the wait for the model
      if (session_.gpu) {
        RETURN_IF_ERROR(ctx_.gpu_predictors->Rebuild(*session_.gpu, **it, 0, history_));
      } else {
        RETURN_IF_ERROR(RebuildGroup(*session_.cache, **it, ctx_.model->config(),
                                     ctx_.model->backend(), 0, history_));
      }
      session_.rebuild_seconds += Since(start);
    }
    it = pending_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<ResumedSession> MigrationReceiver::OnTrailer(const v1::MigrationTrailer& t) {
  if (stage_ != Stage::kChunks) {
    return absl::FailedPreconditionError("a trailer outside the chunk phase of the stream");
  }
  stage_ = Stage::kFailed;
  if (t.chunk_count() != next_sequence_ || handshake_.chunk_count() != next_sequence_ ||
      t.kv_bytes() != session_.kv_bytes_received ||
      handshake_.kv_bytes() != session_.kv_bytes_received || t.crc32c() != crc_of_crcs_) {
    return absl::DataLossError(absl::StrCat(
        "stream ended after ", next_sequence_, " chunks and ", session_.kv_bytes_received,
        " bytes; the handshake announced ", handshake_.chunk_count(), " chunks and ",
        handshake_.kv_bytes(), " bytes, the trailer ", t.chunk_count(), " and ", t.kv_bytes()));
  }
  for (size_t l = 0; l < rows_left_.size(); ++l) {
    if (rows_left_[l] != 0) {
      return absl::DataLossError(
          absl::StrCat("layer ", l, " is missing ", rows_left_[l], " of its K/V rows"));
    }
  }
  RETURN_IF_ERROR(RebuildReadyGroups());
  if (!pending_.empty()) {
    return absl::InternalError("groups left unrebuilt after every anchor arrived");
  }
  const auto tokens = std::span<const int32_t>(session_.tokens);
  auto lock = LockModel();
  if (session_.gpu && session_.mode == MigrationMode::kReconstruct) {
    // Rebuilds were queued on the device as their anchors landed; what of them still runs counts
    // as rebuild time (the forward pass below waits for the uploads by itself).
    const auto start = Clock::now();
    RETURN_IF_ERROR(session_.gpu->WaitRebuilds());
    session_.rebuild_seconds += Since(start);
  }
  GpuModel* gpu = session_.gpu ? ctx_.gpu : nullptr;
  if (session_.mode == MigrationMode::kTokenReplay && history_ > 0) {
    const auto start = Clock::now();
    const auto history = tokens.first(history_);
    ASSIGN_OR_RETURN(
        std::vector<float> ignored,
        gpu ? gpu->Prefill(history, *session_.gpu) : ctx_.model->Prefill(history, *session_.cache));
    session_.prefill_seconds = Since(start);
  }
  ASSIGN_OR_RETURN(session_.logits, gpu ? gpu->Decode(tokens.back(), *session_.gpu)
                                        : ctx_.model->Decode(tokens.back(), *session_.cache));
  stage_ = Stage::kDone;
  return std::move(session_);
}

absl::Status MigrationReceiver::OnFrame(const v1::MigrationFrame& frame) {
  switch (frame.frame_case()) {
    case v1::MigrationFrame::kHandshake:
      return OnHandshake(frame.handshake());
    case v1::MigrationFrame::kChunk:
      return OnChunk(frame.chunk());
    case v1::MigrationFrame::kTrailer: {
      auto r = OnTrailer(frame.trailer());
      if (!r.ok()) return r.status();
      resumed_ = std::make_unique<absl::StatusOr<ResumedSession>>(std::move(r));
      return absl::OkStatus();
    }
    default:
      stage_ = Stage::kFailed;
      return absl::InvalidArgumentError("an empty migration frame");
  }
}

absl::StatusOr<ResumedSession> MigrationReceiver::TakeResumed() {
  if (!resumed_) return absl::FailedPreconditionError("the migration has not finished");
  auto r = std::move(*resumed_);
  resumed_.reset();
  return r;
}

}  // namespace riskkv
