// riskkv-node's gRPC service (see node_service.h).
#include "services/node/node_service.h"

#include <algorithm>
#include <condition_variable>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "services/session_codec.h"
#include "spdlog/spdlog.h"

namespace riskkv {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

grpc::Status Bad(const std::string& m) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, m);
}

}  // namespace

RateLimiter::RateLimiter(double bits_per_second, double burst_bytes)
    : rate_(bits_per_second / 8.0),
      burst_(burst_bytes),
      tokens_(burst_bytes),
      last_(std::chrono::steady_clock::now()) {}

void RateLimiter::Acquire(int64_t bytes) {
  if (rate_ <= 0) return;
  std::unique_lock lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
  last_ = now;
  tokens_ -= static_cast<double>(bytes);
  if (tokens_ < 0) {
    const double wait = -tokens_ / rate_;
    lock.unlock();  // others queue behind the debt this send took on
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
}

NodeService::NodeService(Model& model, NodeOptions options, NodeMetrics* metrics)
    : model_(model),
      options_(std::move(options)),
      metrics_(metrics),
      link_(options_.link_mbps * 1e6),
      prefill_spt_(options_.prefill_seconds_per_token),
      rebuild_spt_(options_.rebuild_seconds_per_token) {
  std::random_device rd;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%06x-", rd() & 0xFFFFFF);
  id_prefix_ = buf;
  SetRetention(std::move(options_.retention));
}

void NodeService::SetRetention(std::shared_ptr<const Retention> retention) {
  const double version = retention ? static_cast<double>(retention->policy.version) : 0;
  if (options_.gpu != nullptr && retention && retention->bank && !retention->gpu_predictors) {
    // The bank's maps go to the GPU once per version; without them the node refuses RECONSTRUCT
    // (the handshake names why) and AUTO moves on to another mode.
    auto preds = GpuPredictors::Create(*options_.gpu, *retention->bank);
    if (preds.ok()) {
      auto with_gpu = std::make_shared<Retention>(*retention);
      with_gpu->gpu_predictors = std::shared_ptr<const GpuPredictors>(std::move(*preds));
      retention = std::move(with_gpu);
    } else {
      spdlog::error("predictor bank {} not loaded on the GPU: {}", retention->bank->content_hash(),
                    preds.status().ToString());
    }
  }
  {
    std::lock_guard lock(retention_mu_);
    retention_ = std::move(retention);
  }
  if (metrics_) metrics_->SetPolicyVersion(version);
}

namespace {

constexpr double kWeight = 0.3;         // of a new measurement in the running estimate
constexpr int64_t kMinTokens = 8;       // shorter prefills and rebuilds say little about speed
constexpr double kMinBytes = 64 << 10;  // likewise for transfers
constexpr size_t kMaxPeers = 256;

void Blend(double* estimate, bool* measured, double value) {
  *estimate = *measured ? (1 - kWeight) * *estimate + kWeight * value : value;
  *measured = true;
}

}  // namespace

void NodeService::MeasurePrefill(double seconds, int64_t tokens) {
  if (!options_.measure_speeds || tokens < kMinTokens || !(seconds > 0)) return;
  std::lock_guard lock(speed_mu_);
  Blend(&prefill_spt_, &prefill_measured_, seconds / static_cast<double>(tokens));
}

void NodeService::MeasureRebuild(double seconds, int64_t tokens) {
  if (!options_.measure_speeds || tokens < kMinTokens || !(seconds > 0)) return;
  std::lock_guard lock(speed_mu_);
  Blend(&rebuild_spt_, &rebuild_measured_, seconds / static_cast<double>(tokens));
}

void NodeService::MeasurePeer(const std::string& target, double bytes, double seconds,
                              const v1::HandshakeAccepted& accepted) {
  if (!options_.measure_speeds) return;
  std::lock_guard lock(speed_mu_);
  if (!peers_.count(target) && peers_.size() >= kMaxPeers) peers_.erase(peers_.begin());
  Peer& p = peers_[target];
  if (bytes >= kMinBytes && seconds > 0) {
    bool measured = p.bytes_per_second > 0;
    Blend(&p.bytes_per_second, &measured, bytes / seconds);
  }
  if (accepted.prefill_seconds_per_token() > 0) {
    p.prefill_seconds_per_token = accepted.prefill_seconds_per_token();
  }
  if (accepted.rebuild_seconds_per_token() > 0) {
    p.rebuild_seconds_per_token = accepted.rebuild_seconds_per_token();
  }
}

std::shared_ptr<const Retention> NodeService::retention() const {
  std::lock_guard lock(retention_mu_);
  return retention_;
}

absl::StatusOr<std::string> NodeService::Register(std::shared_ptr<Session> s) {
  std::lock_guard lock(mu_);
  if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this node serves its limit of ", options_.max_sessions, " sessions"));
  }
  std::string id = id_prefix_ + std::to_string(next_id_++);
  sessions_[id] = std::move(s);
  CountSessions();
  return id;
}

void NodeService::CountSessions() {
  if (metrics_) metrics_->SetActiveSessions(static_cast<double>(sessions_.size()));
}

int64_t NodeService::Capacity(const Session& s) const {
  return s.gpu ? s.gpu->capacity() : s.cache->capacity();
}

int64_t NodeService::RowBytes(const Session& s) const {
  return s.gpu ? model_.config().kv_width() * 2 : s.cache->token_bytes();
}

absl::Status NodeService::NewKv(Session& s, int64_t capacity) {
  if (options_.gpu != nullptr) {
    ASSIGN_OR_RETURN(s.gpu, options_.gpu->NewSession(capacity));
  } else {
    ASSIGN_OR_RETURN(s.cache, model_.NewKvCache(capacity, options_.kv_dtype));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> NodeService::Prefill(Session& s,
                                                        std::span<const int32_t> tokens) {
  return s.gpu ? options_.gpu->Prefill(tokens, *s.gpu) : model_.Prefill(tokens, *s.cache);
}

absl::StatusOr<std::vector<float>> NodeService::DecodeLast(Session& s) {
  return s.gpu ? options_.gpu->Decode(s.tokens.back(), *s.gpu)
               : model_.Decode(s.tokens.back(), *s.cache);
}

absl::Status NodeService::CopyKv(Session& from, Session& to) {
  to.tokens = from.tokens;
  if (!from.gpu) {
    ASSIGN_OR_RETURN(to.cache, from.cache->Clone());
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(NewKv(to, from.gpu->capacity()));
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> host, HostKv(from));
  std::vector<int32_t> layers(model_.config().n_layers);
  std::iota(layers.begin(), layers.end(), 0);
  RETURN_IF_ERROR(to.gpu->UploadFrom(*host, layers));
  return to.gpu->SetTokens(host->n_tokens());
}

absl::StatusOr<std::unique_ptr<KvCache>> NodeService::HostKv(Session& s) {
  ASSIGN_OR_RETURN(auto host,
                   model_.NewKvCache(std::max<int64_t>(1, s.gpu->n_tokens()), DType::kF16));
  RETURN_IF_ERROR(s.gpu->DownloadTo(*host));
  return host;
}

absl::StatusOr<std::shared_ptr<NodeService::Session>> NodeService::Acquire(const std::string& id) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return absl::NotFoundError("no session '" + id + "' on this node");
    s = it->second;
  }
  std::lock_guard lock(s->mu);
  if (s->busy) {
    return absl::FailedPreconditionError("session '" + id + "' is busy (generating or migrating)");
  }
  s->busy = true;
  return s;
}

void NodeService::Release(const std::shared_ptr<Session>& s) {
  std::lock_guard lock(s->mu);
  s->busy = false;
}

void NodeService::Fill(const std::string& id, const Session& s, bool with_tokens,
                       v1::SessionInfo* info) {
  info->set_session_id(id);
  info->set_tokens(static_cast<int64_t>(s.tokens.size()));
  info->set_generated(s.generated);
  info->set_model_fingerprint(options_.model_fingerprint);
  if (with_tokens) {
    for (int32_t t : s.tokens) info->add_token_ids(t);
    auto text = model_.tokenizer().Decode(s.tokens, /*skip_special=*/false);
    if (text.ok()) info->set_text(*text);
  }
}

grpc::Status NodeService::StartSession(grpc::ServerContext*, const v1::StartSessionRequest* req,
                                       v1::SessionInfo* info) {
  const ModelConfig& c = model_.config();
  if (req->prompt().empty() == (req->token_ids_size() == 0)) {
    return Bad("StartSession needs exactly one of prompt and token_ids");
  }
  auto sampler = DecodeSampling(req->sampling());
  if (!sampler.ok()) return ToGrpc(sampler.status());
  auto s = std::make_shared<Session>();
  s->sampler = *std::move(sampler);
  if (!req->prompt().empty()) {
    auto ids = model_.tokenizer().Encode(req->prompt(), /*add_special=*/true, false);
    if (!ids.ok()) return ToGrpc(ids.status());
    s->tokens = *ids;
  } else {
    for (int32_t t : req->token_ids()) {
      if (t < 0 || t >= c.vocab) {
        return Bad(absl::StrCat("token id ", t, " outside the vocabulary of ", c.vocab));
      }
      s->tokens.push_back(t);
    }
  }
  const int64_t capacity = options_.capacity > 0 ? options_.capacity : c.context_length;
  if (s->tokens.empty() || static_cast<int64_t>(s->tokens.size()) + 1 > capacity) {
    return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                        absl::StrCat("a prompt of ", s->tokens.size(), " tokens does not fit the ",
                                     capacity, "-token session limit"));
  }
  {
    std::lock_guard lock(mu_);
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("this node serves its limit of ", options_.max_sessions, " sessions"));
    }
  }
  if (auto made = NewKv(*s, capacity); !made.ok()) return ToGrpc(made);
  {
    std::lock_guard lock(model_mu_);
    const auto t0 = Clock::now();
    auto l = Prefill(*s, s->tokens);
    if (!l.ok()) return ToGrpc(l.status());
    MeasurePrefill(Since(t0), static_cast<int64_t>(s->tokens.size()));
    s->pending_logits = std::move(*l);
  }
  Fill("", *s, false, info);
  auto id = Register(s);
  if (!id.ok()) return ToGrpc(id.status());
  info->set_session_id(*id);
  return grpc::Status::OK;
}

grpc::Status NodeService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                   grpc::ServerWriter<v1::GenerateReply>* writer) {
  if (req->max_tokens() < 1) return Bad("max_tokens must be >= 1");
  auto s = Acquire(req->session_id());
  if (!s.ok()) return ToGrpc(s.status());
  Session& sess = **s;
  grpc::Status status = grpc::Status::OK;
  for (int i = 0; i < req->max_tokens() && !ctx->IsCancelled(); ++i) {
    if (static_cast<int64_t>(sess.tokens.size()) >= Capacity(sess)) {
      status = grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "the session reached its length limit");
      break;
    }
    std::vector<float> logits = std::move(sess.pending_logits);
    sess.pending_logits.clear();
    if (logits.empty()) {
      std::lock_guard lock(model_mu_);
      auto l = DecodeLast(sess);
      if (!l.ok()) {
        status = ToGrpc(l.status());
        break;
      }
      logits = std::move(*l);
    }
    const int32_t t = sess.sampler->Sample(logits);
    sess.tokens.push_back(t);
    ++sess.generated;
    v1::GenerateReply r;
    r.set_token_id(t);
    r.set_text(model_.tokenizer().TokenBytes(t));
    if (!writer->Write(r)) break;
  }
  Release(*s);
  return status;
}

grpc::Status NodeService::GetSession(grpc::ServerContext*, const v1::GetSessionRequest* req,
                                     v1::SessionInfo* info) {
  std::shared_ptr<Session> s;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(req->session_id());
    if (it == sessions_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "no session '" + req->session_id() + "' on this node");
    }
    s = it->second;
  }
  std::lock_guard lock(s->mu);
  if (s->busy) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "session '" + req->session_id() + "' is busy");
  }
  Fill(req->session_id(), *s, req->with_tokens(), info);
  return grpc::Status::OK;
}

grpc::Status NodeService::ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                                       v1::ListSessionsReply* reply) {
  std::lock_guard lock(mu_);
  for (const auto& [id, s] : sessions_) {
    auto* info = reply->add_sessions();
    // A busy session's state belongs to the call using it; only its flag is read then.
    std::lock_guard session_lock(s->mu);
    if (s->busy) {
      info->set_session_id(id);
      info->set_model_fingerprint(options_.model_fingerprint);
      info->set_busy(true);
    } else {
      Fill(id, *s, /*with_tokens=*/false, info);
    }
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest* req,
                                       v1::CloseSessionReply*) {
  auto s = Acquire(req->session_id());
  if (!s.ok()) return ToGrpc(s.status());
  std::lock_guard lock(mu_);
  sessions_.erase(req->session_id());
  CountSessions();
  return grpc::Status::OK;
}

grpc::Status NodeService::Score(grpc::ServerContext*, const v1::ScoreRequest* req,
                                v1::ScoreReply* reply) {
  const ModelConfig& c = model_.config();
  if (req->token_ids_size() == 0) return Bad("Score needs token_ids");
  for (int32_t t : req->token_ids()) {
    if (t < 0 || t >= c.vocab) {
      return Bad(absl::StrCat("token id ", t, " outside the vocabulary of ", c.vocab));
    }
  }
  auto s = Acquire(req->session_id());
  if (!s.ok()) return ToGrpc(s.status());
  Session& sess = **s;
  absl::StatusOr<NllResult> nll = absl::UnknownError("");
  const std::vector<int32_t> ids(req->token_ids().begin(), req->token_ids().end());
  if (static_cast<int64_t>(sess.tokens.size()) + req->token_ids_size() > Capacity(sess)) {
    nll = absl::OutOfRangeError("the continuation does not fit the session's length limit");
  } else {
    // Scored on a copy: the session's own KV stays as it was.
    std::lock_guard lock(model_mu_);
    Session work;
    nll = [&]() -> absl::StatusOr<NllResult> {
      RETURN_IF_ERROR(CopyKv(sess, work));
      std::vector<float> first = sess.pending_logits;
      if (first.empty()) {
        ASSIGN_OR_RETURN(first, DecodeLast(work));
      }
      return work.gpu ? options_.gpu->TeacherForcedNll(ids, *work.gpu, first)
                      : model_.TeacherForcedNll(ids, *work.cache, first);
    }();
  }
  Release(*s);
  if (!nll.ok()) return ToGrpc(nll.status());
  reply->set_mean_nll(nll->mean);
  reply->set_tokens(req->token_ids_size());
  return grpc::Status::OK;
}

std::vector<MigrationMode> NodeService::RankModes(const Session& s, const Retention* retention,
                                                  const std::string& target,
                                                  std::string* reason) const {
  const ModelConfig& c = model_.config();
  const auto history = static_cast<double>(s.tokens.size() - 1);
  const double row = static_cast<double>(RowBytes(s));
  // Each input: measured toward this target, measured here, configured, or assumed.
  double rate = link_.bytes_per_second() > 0 ? link_.bytes_per_second() : 125e6;
  std::string rate_from = link_.bytes_per_second() > 0 ? "--link-mbps" : "assumed";
  double prefill, rebuild;
  std::string prefill_from, rebuild_from;
  {
    std::lock_guard lock(speed_mu_);
    prefill = prefill_spt_;
    rebuild = rebuild_spt_;
    prefill_from = prefill_measured_ ? "measured here" : "assumed";
    rebuild_from = rebuild_measured_ ? "measured here" : "assumed";
    if (auto it = peers_.find(target); it != peers_.end()) {
      const Peer& p = it->second;
      if (p.bytes_per_second > 0 && (rate_from == "assumed" || p.bytes_per_second < rate)) {
        rate = p.bytes_per_second;
        rate_from = "measured to the target";
      }
      if (p.prefill_seconds_per_token > 0) {
        prefill = p.prefill_seconds_per_token;
        prefill_from = "the target's";
      }
      if (p.rebuild_seconds_per_token > 0) {
        rebuild = p.rebuild_seconds_per_token;
        rebuild_from = "the target's";
      }
    }
  }
  const double full = 2 * history * row * static_cast<double>(c.n_layers) / rate;
  const double replay = history * prefill;
  std::vector<std::pair<double, MigrationMode>> est = {{full, MigrationMode::kFullKv},
                                                       {replay, MigrationMode::kTokenReplay}};
  double recon = -1;
  if (retention != nullptr) {
    recon = 2 * history * row * retention->policy.kept_layers.size() / rate + history * rebuild;
    est.insert(est.begin(), {recon, MigrationMode::kReconstruct});
  }
  std::stable_sort(est.begin(), est.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  *reason =
      absl::StrCat("auto: estimated reconstruct ",
                   recon >= 0 ? absl::StrCat(recon, " s") : std::string("n/a (no policy)"),
                   ", full_kv ", full, " s, token_replay ", replay, " s at ", rate * 8 / 1e6,
                   " Mbit/s (", rate_from, "), prefill ", prefill * 1e3, " ms/token (",
                   prefill_from, "), rebuild ", rebuild * 1e3, " ms/token (", rebuild_from, ")");
  std::vector<MigrationMode> ranked;
  for (const auto& e : est) ranked.push_back(e.second);
  return ranked;
}

grpc::Status NodeService::Migrate(grpc::ServerContext* caller, const v1::MigrateRequest* req,
                                  v1::MigrateReply* reply) {
  const auto start = Clock::now();
  if (req->target_address().empty()) return Bad("target_address is empty");
  if (!(req->timeout_seconds() >= 0 && req->timeout_seconds() <= 86400)) {
    return Bad("timeout_seconds must be in [0, 86400]");
  }
  MigrationMode mode = MigrationMode::kFullKv;
  std::string reason = "requested";
  if (req->mode() != v1::AUTO) {
    auto m = FromProto(req->mode());
    if (!m.ok()) return ToGrpc(m.status());
    mode = *m;
  }
  auto s = Acquire(req->session_id());
  if (!s.ok()) return ToGrpc(s.status());
  // The modes to try in order. AUTO ranks them by estimate; a refused handshake (the target
  // lacks the bank or holds another policy version) moves on to the next, as a fallback does.
  std::vector<MigrationMode> attempts;
  if (req->mode() == v1::AUTO) {
    attempts = RankModes(**s, retention().get(), req->target_address(), &reason);
  } else {
    attempts = {mode};
    for (MigrationMode m : {MigrationMode::kFullKv, MigrationMode::kTokenReplay}) {
      if (std::find(attempts.begin(), attempts.end(), m) == attempts.end()) attempts.push_back(m);
    }
  }
  if (!req->allow_fallback()) attempts.resize(1);
  const double timeout =
      req->timeout_seconds() > 0 ? req->timeout_seconds() : options_.default_timeout_seconds;
  const auto deadline = std::chrono::system_clock::now() + Seconds(timeout);
  absl::Status status;
  for (MigrationMode m : attempts) {
    bool refused = false;
    status = MigrateOnce(caller, **s, req->session_id(), *req, m, deadline, reply, &refused);
    if (status.ok()) {
      reply->set_mode(ToProto(m));
      reply->set_mode_reason(reason);
      reply->set_total_seconds(Since(start));
      if (metrics_) metrics_->Migration("source", MigrationModeName(m), "ok", Since(start));
      return grpc::Status::OK;
    }
    if (metrics_) {
      metrics_->Migration("source", MigrationModeName(m), refused ? "refused" : "failed", 0);
      metrics_->Failure("source", refused ? "handshake_refused" : "transfer_failed");
    }
    if (!refused) break;
    reason = absl::StrCat(req->mode() == v1::AUTO ? reason + "; " : std::string(),
                          "fallback: ", MigrationModeName(m), " refused (", status.message(), ")");
  }
  Release(*s);  // the session stays here, intact
  return ToGrpc(absl::Status(status.code(), absl::StrCat("migration of '", req->session_id(),
                                                         "' failed, the session stays on this "
                                                         "node: ",
                                                         status.message())));
}

absl::Status NodeService::MigrateOnce(grpc::ServerContext* caller, Session& s,
                                      const std::string& id, const v1::MigrateRequest& req,
                                      MigrationMode mode,
                                      std::chrono::system_clock::time_point deadline,
                                      v1::MigrateReply* reply, bool* refused) {
  *refused = false;
  const std::shared_ptr<const Retention> retention = this->retention();
  if (mode == MigrationMode::kReconstruct && retention == nullptr) {
    *refused = true;  // nothing moved; a fallback may still run
    return absl::FailedPreconditionError(
        "this node has no retention policy for RECONSTRUCT (start it with --policy or --control)");
  }
  const SendOptions so{mode, options_.model_fingerprint, retention ? &retention->policy : nullptr,
                       options_.max_chunk_bytes};
  // A GPU session's KV is copied to host memory for the stream.
  std::unique_ptr<KvCache> gpu_copy;
  if (s.gpu) {
    ASSIGN_OR_RETURN(gpu_copy, HostKv(s));
  }
  const SessionView view{gpu_copy ? gpu_copy.get() : s.cache.get(), s.tokens, &*s.sampler};
  ASSIGN_OR_RETURN(v1::MigrationHandshake h, MakeHandshake(view, so));
  auto channel = grpc::CreateChannel(
      req.target_address(),
      options_.peer_credentials ? options_.peer_credentials : grpc::InsecureChannelCredentials());
  auto stub = v1::Node::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  auto stream = stub->Receive(&ctx);
  // Ends the stream; the target's own status (it may have closed the stream with a precise
  // reason) wins over ours. `cancel` when the target may still be waiting for frames.
  auto finish = [&](const std::string& what, bool cancel = true) {
    if (cancel) ctx.TryCancel();
    const grpc::Status st = stream->Finish();
    if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) {
      return absl::Status(FromGrpc(st).code(), what + ": " + st.error_message());
    }
    return absl::UnavailableError(what);
  };
  v1::MigrationFrame frame;
  *frame.mutable_handshake() = h;
  v1::ReceiveReply r;
  if (!stream->Write(frame) || !stream->Read(&r)) {
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    *refused = st.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
    return absl::Status(st.ok() ? absl::StatusCode::kUnavailable : FromGrpc(st).code(),
                        "target " + req.target_address() + " refused the handshake: " +
                            (st.ok() ? std::string("stream closed") : st.error_message()));
  }
  if (!r.has_accepted()) return finish("target answered the handshake out of protocol");
  const v1::HandshakeAccepted accepted = r.accepted();
  const auto t0 = Clock::now();
  bool broke = false;
  absl::Status sent = SendKv(view, h, so, [&](v1::MigrationFrame f) {
    if (caller->IsCancelled()) return absl::CancelledError("the caller cancelled the migration");
    if (f.has_chunk()) link_.Acquire(static_cast<int64_t>(f.chunk().data().size()));
    if (!stream->Write(f)) {
      broke = true;
      return absl::UnavailableError("the stream to the target broke");
    }
    return absl::OkStatus();
  });
  if (!sent.ok()) return finish(std::string(sent.message()), /*cancel=*/!broke);
  const double send_seconds = Since(t0);  // the wire alone, for the rate AUTO learns
  if (!stream->Read(&r) || !r.has_resumed()) return finish("target did not resume the session");
  reply->set_transfer_seconds(Since(t0));
  reply->set_kv_bytes_sent(h.kv_bytes());
  if (mode == MigrationMode::kReconstruct) {
    const int64_t row = RowBytes(s);
    const int64_t history = h.history_tokens();
    reply->set_kv_bytes_omitted(2 * history * row * (model_.config().n_layers - h.layers_size()));
  }
  reply->set_rebuild_seconds(r.resumed().rebuild_seconds());
  reply->set_recovery_seconds(r.resumed().recovery_seconds());
  MeasurePeer(req.target_address(), static_cast<double>(h.kv_bytes()), send_seconds, accepted);
  if (metrics_) {
    metrics_->Transfer(MigrationModeName(mode), reply->transfer_seconds(),
                       static_cast<double>(reply->kv_bytes_sent()),
                       static_cast<double>(reply->kv_bytes_omitted()));
  }
  if (caller->IsCancelled()) return finish("the caller cancelled the migration");
  // Second phase: stop serving here, then hand over. If the target does not confirm, the
  // session comes back.
  std::shared_ptr<Session> keep;
  {
    std::lock_guard lock(mu_);
    auto it = sessions_.find(id);
    keep = it->second;
    sessions_.erase(it);
    CountSessions();
  }
  v1::MigrationFrame commit;
  commit.mutable_commit();
  // Once the target said `committed` it serves the session, whatever happens to the stream.
  const bool committed =
      stream->Write(commit) && stream->WritesDone() && stream->Read(&r) && r.has_committed();
  const grpc::Status st = stream->Finish();
  if (!committed) {
    std::lock_guard lock(mu_);
    sessions_[id] = keep;
    CountSessions();
    return absl::Status(st.ok() ? absl::StatusCode::kUnavailable : FromGrpc(st).code(),
                        "target did not confirm the hand-over" +
                            (st.ok() ? std::string() : ": " + st.error_message()));
  }
  reply->set_target_session_id(r.committed().session_id());
  return absl::OkStatus();
}

// Cancels a server call at its deadline, or when it waited `idle` on its source, unless disarmed
// or destroyed first. Touch() and Busy() only take the lock: the thread wakes at most once per
// idle period to look, so the per-chunk path never wakes it.
class NodeService::Watchdog {
 public:
  using TimePoint = std::chrono::system_clock::time_point;
  Watchdog(grpc::ServerContext* ctx, TimePoint deadline, std::chrono::system_clock::duration idle)
      : deadline_(deadline), idle_(idle), last_(std::chrono::system_clock::now()) {
    thread_ = std::thread([this, ctx] {
      std::unique_lock lock(mu_);
      while (!done_) {
        if (cv_.wait_until(lock, std::min(deadline_, last_ + idle_), [this] { return done_; })) {
          break;
        }
        const TimePoint now = std::chrono::system_clock::now();
        if (busy_) last_ = now;  // this node's own work is not the source idling
        if (now >= deadline_ || now >= last_ + idle_) {
          fired_ = now >= deadline_ ? "deadline" : "idle";
          ctx->TryCancel();
          break;
        }
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Waiting for the source from now: the idle clock starts again.
  void Touch() {
    std::lock_guard lock(mu_);
    last_ = std::chrono::system_clock::now();
    busy_ = false;
  }
  // This node is working (rebuilding, prefilling): the idle clock stops until Touch().
  void Busy() {
    std::lock_guard lock(mu_);
    busy_ = true;
  }
  // Why it cancelled the call ("deadline" or "idle"), or empty.
  std::string fired() {
    std::lock_guard lock(mu_);
    return fired_;
  }
  // Stops the watchdog; false when it fired first.
  bool Disarm() {
    {
      std::lock_guard lock(mu_);
      if (!fired_.empty()) return false;
      done_ = true;
    }
    cv_.notify_all();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const TimePoint deadline_;
  const std::chrono::system_clock::duration idle_;
  TimePoint last_;
  bool busy_ = false;
  bool done_ = false;
  std::string fired_;
  std::thread thread_;
};

grpc::Status NodeService::Receive(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream) {
  if (receiving_.fetch_add(1) >= options_.max_concurrent_receives) {
    receiving_.fetch_sub(1);
    if (metrics_) metrics_->Failure("target", "busy");
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("this node is already receiving its limit of ",
                                     options_.max_concurrent_receives, " migrations"));
  }
  // The caller's deadline, but never longer than this node's own bound.
  const auto bound = std::chrono::system_clock::now() + Seconds(options_.default_timeout_seconds);
  grpc::Status st;
  {
    Watchdog watchdog(ctx, std::min(bound, ctx->deadline()),
                      Seconds(options_.receive_idle_seconds));
    st = ReceiveAdmitted(ctx, stream, watchdog);
    const std::string fired = watchdog.fired();
    if (fired == "deadline") {
      st = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("the migration did not finish within this node's bound of ",
                                     options_.default_timeout_seconds, " s; nothing was applied"));
    } else if (fired == "idle") {
      st = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("the source sent nothing for ", options_.receive_idle_seconds,
                                     " s; nothing was applied"));
    }
  }
  receiving_.fetch_sub(1);
  return st;
}

grpc::Status NodeService::ReceiveAdmitted(
    grpc::ServerContext*, grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream,
    Watchdog& watchdog) {
  const auto start = Clock::now();
  auto fail = [&](const std::string& reason, const absl::Status& s) {
    if (metrics_) {
      metrics_->Failure("target", reason);
      metrics_->Migration("target", "unknown", "failed", 0);
    }
    return ToGrpc(s);
  };
  v1::MigrationFrame f;
  if (!stream->Read(&f)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the stream carried no handshake");
  }
  watchdog.Touch();
  const auto first_byte = Clock::now();
  if (!f.has_handshake()) {
    return fail("protocol", absl::InvalidArgumentError("the first frame must be a handshake"));
  }
  {
    std::lock_guard lock(mu_);
    if (static_cast<int>(sessions_.size()) >= options_.max_sessions) {
      return fail("session_limit",
                  absl::ResourceExhaustedError(absl::StrCat("this node serves its limit of ",
                                                            options_.max_sessions, " sessions")));
    }
  }
  const std::shared_ptr<const Retention> retention = this->retention();
  MigrationReceiver rx({&model_, options_.model_fingerprint,
                        retention ? &retention->policy : nullptr,
                        retention ? retention->bank.get() : nullptr,
                        retention ? &retention->groups : nullptr, options_.capacity, &model_mu_,
                        options_.gpu, retention ? retention->gpu_predictors.get() : nullptr});
  watchdog.Busy();
  const absl::Status checked = rx.OnFrame(f);
  watchdog.Touch();
  if (auto s = checked; !s.ok()) {
    if (metrics_) {
      auto m = FromProto(f.handshake().mode());
      metrics_->Failure("target", "handshake");
      metrics_->Migration("target", m.ok() ? MigrationModeName(*m) : "unknown", "refused", 0);
    }
    return ToGrpc(s);
  }
  auto mode_name = MigrationModeName(*FromProto(f.handshake().mode()));
  v1::ReceiveReply r;
  {
    std::lock_guard lock(speed_mu_);
    // Measurements only: 0 leaves the source to its own estimate.
    r.mutable_accepted()->set_prefill_seconds_per_token(prefill_measured_ ? prefill_spt_ : 0);
    r.mutable_accepted()->set_rebuild_seconds_per_token(rebuild_measured_ ? rebuild_spt_ : 0);
  }
  stream->Write(r);
  bool trailer = false;
  while (!trailer) {
    if (!stream->Read(&f)) {
      return fail("truncated", absl::AbortedError("the stream ended before its trailer; nothing "
                                                  "was applied"));
    }
    watchdog.Touch();
    if (f.has_commit())
      return fail("protocol", absl::InvalidArgumentError("commit before trailer"));
    watchdog.Busy();  // a complete anchor set may start a rebuild
    const absl::Status applied = rx.OnFrame(f);
    watchdog.Touch();
    if (auto s = applied; !s.ok()) {
      return fail(s.code() == absl::StatusCode::kDataLoss ? "corrupt" : "bad_chunk", s);
    }
    trailer = f.has_trailer();
  }
  watchdog.Busy();
  auto resumed = rx.TakeResumed();
  if (!resumed.ok()) return fail("resume", resumed.status());
  const auto history = static_cast<int64_t>(resumed->tokens.size()) - 1;
  if (resumed->prefill_seconds > 0) MeasurePrefill(resumed->prefill_seconds, history);
  if (resumed->rebuild_seconds > 0) MeasureRebuild(resumed->rebuild_seconds, history);
  const double recovery = Since(first_byte);
  r.Clear();
  r.mutable_resumed()->set_rebuild_seconds(resumed->rebuild_seconds);
  r.mutable_resumed()->set_prefill_seconds(resumed->prefill_seconds);
  r.mutable_resumed()->set_recovery_seconds(recovery);
  stream->Write(r);
  watchdog.Touch();  // the source's turn again, after this node's rebuild and decode step
  if (!stream->Read(&f)) {
    return fail("not_committed", absl::AbortedError("the source did not commit; the resumed "
                                                    "session was dropped"));
  }
  if (!f.has_commit()) {
    return fail("protocol", absl::FailedPreconditionError(
                                "after the trailer only a commit may come; the resumed session "
                                "was dropped"));
  }
  auto s = std::make_shared<Session>();
  s->cache = std::move(resumed->cache);
  s->gpu = std::move(resumed->gpu);
  s->tokens = std::move(resumed->tokens);
  s->sampler = std::move(resumed->sampler);
  // The first decode step already ran: its logits give the next token.
  s->pending_logits = std::move(resumed->logits);
  // From here the session is registered: the deadline may no longer cancel the call.
  if (!watchdog.Disarm()) {
    return fail("timeout", absl::DeadlineExceededError("the node's receive deadline passed"));
  }
  auto id = Register(s);
  if (!id.ok()) return fail("session_limit", id.status());
  r.Clear();
  r.mutable_committed()->set_session_id(*id);
  if (!stream->Write(r)) {
    // The source cannot learn that we took the session over, so it keeps serving it.
    std::lock_guard lock(mu_);
    sessions_.erase(*id);
    CountSessions();
    return fail("not_committed", absl::AbortedError("the commit confirmation could not be sent"));
  }
  if (metrics_) {
    metrics_->Migration("target", mode_name, "ok", Since(start));
    metrics_->Recovery(mode_name, recovery);
    if (resumed->rebuild_seconds > 0) metrics_->Rebuild(resumed->rebuild_seconds);
  }
  return grpc::Status::OK;
}

}  // namespace riskkv
