// riskkv-node's gRPC service (see node_service.h).
#include "services/node/node_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/random_id.h"
#include "common/base/status_macros.h"
#include "common/base/stopwatch.h"
#include "common/model/top_logprobs.h"
#include "services/grpc_status.h"
#include "services/migration/migration_sender.h"
#include "services/migration/wire.h"
#include "services/node/migration_source.h"
#include "services/node/migration_target.h"
#include "services/session_codec.h"
#include "spdlog/spdlog.h"

namespace riskkv {
namespace {

grpc::Status Bad(const std::string& m) { return ToGrpc(absl::InvalidArgumentError(m)); }

// A call's engine work stops waiting once its caller is gone.
Scheduler::CheckFn Cancelled(grpc::ServerContext* ctx) {
  return [ctx] {
    return ctx->IsCancelled() ? absl::CancelledError("the call was cancelled") : absl::OkStatus();
  };
}

// A live migration waiting for a session to reach a token group's end stops waiting when no token
// came for this long: the session is not generating (a CPU decode step takes tens of ms; one that
// shares its step with a prompt's 64-token chunk about 130 ms on 2 cores, docs/serving.md).
constexpr absl::Duration kGeneratingGap = absl::Milliseconds(250);

// A receive's minimum rate; its grace covers twice the time one largest chunk takes at that rate,
// so a source that keeps the rate is never cut off between two chunks.
MinimumRate ReceiveRate(const NodeOptions& o) {
  if (!(o.min_receive_bytes_per_second > 0)) return {};
  const double chunk = static_cast<double>(o.max_chunk_bytes > 0 ? o.max_chunk_bytes : 256 << 10);
  return {.min_bytes_per_second = o.min_receive_bytes_per_second,
          .grace = Seconds(
              std::max(o.receive_rate_grace_seconds, 2 * chunk / o.min_receive_bytes_per_second))};
}

// A migration's hold on its session as the sender's hand-over.
class OutboundHandOver final : public HandOver {
 public:
  explicit OutboundHandOver(SessionTable::Outbound& out) : out_(out) {}
  void Withdraw() override { out_.Withdraw(); }
  void Restore() override { out_.Restore(); }

 private:
  SessionTable::Outbound& out_;
};

}  // namespace

NodeService::NodeService(Engine& engine, NodeOptions options, NodeMetrics* metrics)
    : engine_(engine),
      options_(std::move(options)),
      metrics_(metrics),
      access_(options_.access_file),
      scheduler_(engine, options_.scheduler, metrics ? &metrics->serving() : nullptr),
      budget_(options_.kv_budget_bytes, engine.kv_bytes_per_token(),
              [metrics](KvBudget::State s, int64_t bytes) {
                if (metrics)
                  metrics->SetKvBytes(KvBudget::StateName(s), static_cast<double>(bytes));
              }),
      sessions_(
          options_.max_sessions,
          [metrics](size_t n) {
            if (metrics) metrics->SetActiveSessions(static_cast<double>(n));
          },
          options_.max_sessions_per_identity,
          [this](const std::string& owner) { return access_.Limited(owner); }),
      planner_({.prefill_seconds_per_token = options_.prefill_seconds_per_token,
                .rebuild_seconds_per_token = options_.rebuild_seconds_per_token,
                .measure_speeds = options_.measure_speeds,
                .link_bytes_per_second = std::max(0.0, options_.link_mbps * 1e6 / 8)}),
      link_(options_.link_mbps * 1e6) {
  SetRetention(std::move(options_.retention));
  if (metrics_) metrics_->SetKvBudget(static_cast<double>(options_.kv_budget_bytes));
  if (options_.session_idle_ttl_seconds > 0) {
    reaper_ = std::make_unique<SessionReaper>(
        sessions_, absl::Seconds(options_.session_idle_ttl_seconds),
        [this](const SessionTable::Expired& e) {
          spdlog::info("session {} expired after {:.0f} s idle (TTL {} s)", e.id,
                       absl::ToDoubleSeconds(e.idle), options_.session_idle_ttl_seconds);
          if (metrics_) metrics_->SessionExpired();
        });
  }
}

void NodeService::SetRetention(std::shared_ptr<const Retention> retention) {
  const double version = retention ? static_cast<double>(retention->policy.version) : 0;
  if (retention && !retention->policy.arithmetic.empty() && !options_.activations.empty() &&
      retention->policy.arithmetic != options_.activations) {
    spdlog::warn(
        "policy {} was measured with {} activations and this node serves with {}: its ΔNLL "
        "figures do not describe this node's RECONSTRUCT",
        retention->policy.Name(), retention->policy.arithmetic, options_.activations);
  }
  if (retention && retention->bank &&
      (!retention->predictors || &retention->predictors->engine() != &engine_)) {
    // The bank is prepared for the engine once per version (on a GPU its maps go to the
    // device); without it the node refuses RECONSTRUCT (the handshake names why) and AUTO moves
    // on to another mode.
    auto predictors = engine_.LoadPredictors(retention->bank);
    if (predictors.ok()) {
      auto prepared = std::make_shared<Retention>(*retention);
      prepared->predictors = *std::move(predictors);
      retention = std::move(prepared);
    } else {
      spdlog::error("predictor bank {} not loaded on the {} engine: {}",
                    retention->bank->content_hash(), engine_.backend(),
                    predictors.status().ToString());
    }
  }
  {
    absl::MutexLock lock(&retention_mu_);
    retention_ = std::move(retention);
  }
  if (metrics_) metrics_->SetPolicyVersion(version);
}

std::shared_ptr<const Retention> NodeService::retention() const {
  absl::MutexLock lock(&retention_mu_);
  return retention_;
}

void NodeService::Fill(const std::string& id, const NodeSession& s, bool with_tokens,
                       v1::SessionInfo* info) const {
  info->set_session_id(id);
  info->set_tokens(static_cast<int64_t>(s.tokens.size()));
  info->set_generated(s.generated);
  info->set_model_fingerprint(options_.model_fingerprint);
  if (with_tokens) {
    for (int32_t t : s.tokens) info->add_token_ids(t);
    auto text = engine_.tokenizer().Decode(s.tokens, /*skip_special=*/false);
    if (text.ok()) info->set_text(*text);
  }
}

absl::StatusOr<Principal> NodeService::Authorize(grpc::ServerContext* ctx, Action action,
                                                 OwnerFilter* owner) const {
  absl::StatusOr<Principal> who = access_.Check(*ctx, action);
  if (!who.ok()) {
    if (metrics_) {
      metrics_->Denied(who.status().code() == absl::StatusCode::kUnauthenticated
                           ? "unauthenticated"
                           : "permission_denied");
    }
    return who;
  }
  if (owner != nullptr) {
    *owner = who->any_session() ? OwnerFilter() : OwnerFilter(who->identity);
  }
  return who;
}

grpc::Status NodeService::StartSession(grpc::ServerContext* ctx, const v1::StartSessionRequest* req,
                                       v1::SessionInfo* info) {
  const absl::StatusOr<Principal> who = Authorize(ctx, Action::kUseSessions);
  if (!who.ok()) return ToGrpc(who.status());
  if (req->prompt().empty() == (req->token_ids_size() == 0)) {
    return Bad("StartSession needs exactly one of prompt and token_ids");
  }
  auto sampler = DecodeSampling(req->sampling());
  if (!sampler.ok()) return ToGrpc(sampler.status());
  auto s = std::make_unique<NodeSession>();
  s->owner = who->identity;
  s->sampler = *std::move(sampler);
  if (!req->prompt().empty()) {
    auto ids = engine_.tokenizer().Encode(req->prompt(), /*add_special=*/true, false);
    if (!ids.ok()) return ToGrpc(ids.status());
    s->tokens = *ids;
  } else {
    s->tokens.assign(req->token_ids().begin(), req->token_ids().end());
    if (auto ok = engine_.CheckTokenIds(s->tokens); !ok.ok()) return ToGrpc(ok);
  }
  const int64_t capacity =
      options_.capacity > 0 ? options_.capacity : engine_.config().context_length;
  if (s->tokens.empty() || static_cast<int64_t>(s->tokens.size()) + 1 > capacity) {
    return ToGrpc(absl::OutOfRangeError(absl::StrCat("a prompt of ", s->tokens.size(),
                                                     " tokens does not fit the ", capacity,
                                                     "-token session limit")));
  }
  if (auto room = sessions_.CheckRoom(s->owner); !room.ok()) return ToGrpc(room);
  s->charge = budget_.Open(KvBudget::State::kSessions);
  if (auto charged = s->charge.GrowTo(static_cast<int64_t>(s->tokens.size())); !charged.ok()) {
    return ToGrpc(charged);
  }
  auto kv = engine_.NewStore(capacity);
  if (!kv.ok()) return ToGrpc(kv.status());
  s->kv = *std::move(kv);
  const Stopwatch prefill;
  double step_seconds = 0;  // the engine's steps, without the queue: what the planner measures
  auto logits =
      scheduler_.Prefill(WorkKind::kPrefill, s->tokens, *s->kv, Cancelled(ctx), &step_seconds);
  if (!logits.ok()) return ToGrpc(logits.status());
  planner_.MeasurePrefill(step_seconds, static_cast<int64_t>(s->tokens.size()));
  s->prompt_seconds = prefill.Seconds();
  s->pending_logits = *std::move(logits);
  Fill("", *s, false, info);
  auto id = sessions_.Add(std::move(s));
  if (!id.ok()) return ToGrpc(id.status());
  info->set_session_id(*id);
  return grpc::Status::OK;
}

grpc::Status NodeService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                   grpc::ServerWriter<v1::GenerateReply>* writer) {
  const Stopwatch since_call;
  OwnerFilter mine;
  if (auto who = Authorize(ctx, Action::kUseSessions, &mine); !who.ok()) {
    return ToGrpc(who.status());
  }
  if (req->max_tokens() < 1) return Bad("max_tokens must be >= 1");
  // The stream's last message when the session moved: where to go on.
  auto moved = [&](const SessionMoved& to, int done) {
    v1::GenerateReply r;
    r.mutable_moved()->set_target_address(to.target_address);
    r.mutable_moved()->set_session_id(to.session_id);
    r.mutable_moved()->set_remaining_tokens(req->max_tokens() - done);
    writer->Write(r);
    return grpc::Status::OK;
  };
  auto lease = sessions_.Acquire(req->session_id(), mine);
  if (!lease.ok()) {
    if (auto to = sessions_.MovedTo(req->session_id(), mine)) return moved(*to, 0);
    return ToGrpc(lease.status());
  }
  NodeSession& s = lease->session();
  const Scheduler::CheckFn cancelled = Cancelled(ctx);
  std::optional<Stopwatch> since_token;  // the last token's write
  for (int i = 0; i < req->max_tokens() && !ctx->IsCancelled(); ++i) {
    // A migration pauses the session between two tokens; if it moves, the caller follows.
    if (std::optional<SessionMoved> to = lease->Yield()) return moved(*to, i);
    if (static_cast<int64_t>(s.tokens.size()) >= s.kv->capacity()) {
      return ToGrpc(absl::OutOfRangeError("the session reached its length limit"));
    }
    if (options_.generate_step) options_.generate_step();
    std::vector<float> logits = std::move(s.pending_logits);
    s.pending_logits.clear();
    if (logits.empty()) {
      // The decode step stores the last token's row; the session stays as it is when the node
      // has no room for it.
      if (auto charged = s.charge.GrowTo(static_cast<int64_t>(s.tokens.size())); !charged.ok()) {
        return ToGrpc(charged);
      }
      auto l = scheduler_.Decode(WorkKind::kDecode, s.tokens.back(), *s.kv, cancelled);
      if (!l.ok()) return ToGrpc(l.status());
      logits = *std::move(l);
    }
    int32_t t = 0;
    lease->Publish([&](NodeSession& p) {
      t = p.sampler->Sample(logits);
      p.tokens.push_back(t);
      ++p.generated;
    });
    v1::GenerateReply r;
    r.set_token_id(t);
    r.set_text(engine_.tokenizer().TokenBytes(t));
    if (!writer->Write(r)) break;
    if (metrics_) {
      ServingMetrics& m = metrics_->serving();
      if (since_token) {
        m.InterToken(since_token->Seconds());
      } else {
        // A new session's first token counts its prompt's prefill (StartSession's) too.
        m.FirstToken(since_call.Seconds() + std::max(0.0, s.prompt_seconds));
        s.prompt_seconds = -1;
      }
      m.TokenGenerated();
    }
    since_token.emplace();
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::GetSession(grpc::ServerContext* ctx, const v1::GetSessionRequest* req,
                                     v1::SessionInfo* info) {
  OwnerFilter mine;
  if (auto who = Authorize(ctx, Action::kUseSessions, &mine); !who.ok()) {
    return ToGrpc(who.status());
  }
  return ToGrpc(sessions_.Inspect(
      req->session_id(),
      [&](const NodeSession& s) { Fill(req->session_id(), s, req->with_tokens(), info); }, mine));
}

grpc::Status NodeService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                       v1::ListSessionsReply* reply) {
  OwnerFilter mine;
  if (auto who = Authorize(ctx, Action::kUseSessions, &mine); !who.ok()) {
    return ToGrpc(who.status());
  }
  sessions_.ForEach(
      [&](const std::string& id, const NodeSession* s, bool migrating) {
        auto* info = reply->add_sessions();
        info->set_migrating(migrating);
        if (s != nullptr) {
          Fill(id, *s, /*with_tokens=*/false, info);
          return;
        }
        // A busy session's state belongs to the call using it; only its flag is shown.
        info->set_session_id(id);
        info->set_model_fingerprint(options_.model_fingerprint);
        info->set_busy(true);
      },
      mine);
  return grpc::Status::OK;
}

grpc::Status NodeService::CloseSession(grpc::ServerContext* ctx, const v1::CloseSessionRequest* req,
                                       v1::CloseSessionReply*) {
  OwnerFilter mine;
  if (auto who = Authorize(ctx, Action::kUseSessions, &mine); !who.ok()) {
    return ToGrpc(who.status());
  }
  auto lease = sessions_.Acquire(req->session_id(), mine);
  if (!lease.ok()) return ToGrpc(lease.status());
  return ToGrpc(lease->Remove());
}

grpc::Status NodeService::Score(grpc::ServerContext* ctx, const v1::ScoreRequest* req,
                                v1::ScoreReply* reply) {
  OwnerFilter mine;
  if (auto who = Authorize(ctx, Action::kUseSessions, &mine); !who.ok()) {
    return ToGrpc(who.status());
  }
  if (req->token_ids_size() == 0) return Bad("Score needs token_ids");
  const std::vector<int32_t> ids(req->token_ids().begin(), req->token_ids().end());
  if (auto ok = engine_.CheckTokenIds(ids); !ok.ok()) return ToGrpc(ok);
  const int64_t vocab = engine_.config().vocab;
  auto ids_of = [](const v1::TopLogProbs& r) {
    return std::span<const int32_t>(r.token_ids().data(), r.token_ids_size());
  };
  auto logp_of = [](const v1::TopLogProbs& r) {
    return std::span<const float>(r.logprobs().data(), r.logprobs_size());
  };
  // Top tokens cost about 600 bytes a position each way: bounded so that a reply (and the
  // reference made of it) fits the 4 MiB a gRPC client takes by default.
  constexpr int kMaxTopPositions = 4096;
  if ((req->return_top() || req->reference_size() > 0) &&
      req->token_ids_size() > kMaxTopPositions) {
    return Bad(absl::StrCat("return_top and reference score at most ", kMaxTopPositions,
                            " tokens, not ", req->token_ids_size()));
  }
  if (req->reference_size() > 0) {
    if (req->reference_size() != req->token_ids_size()) {
      return Bad(absl::StrCat("reference holds ", req->reference_size(), " positions for ",
                              req->token_ids_size(), " token_ids"));
    }
    for (int i = 0; i < req->reference_size(); ++i) {
      const v1::TopLogProbs& r = req->reference(i);
      if (auto ok = CheckTopLogProbs(ids_of(r), logp_of(r), vocab); !ok.ok()) {
        return Bad(absl::StrCat("reference position ", i, ": ", ok.message()));
      }
    }
  }
  auto lease = sessions_.Acquire(req->session_id(), mine);
  if (!lease.ok()) return ToGrpc(lease.status());
  const NodeSession& s = lease->session();
  if (static_cast<int64_t>(s.tokens.size() + ids.size()) > s.kv->capacity()) {
    return ToGrpc(
        absl::OutOfRangeError("the continuation does not fit the session's length limit"));
  }
  // Scored on a copy, which the budget counts while it lives: the session's own KV stays as it
  // was.
  KvBudget::Charge copy = budget_.Open(KvBudget::State::kSessions);
  if (auto charged = copy.GrowTo(static_cast<int64_t>(s.tokens.size() + ids.size()));
      !charged.ok()) {
    return ToGrpc(charged);
  }
  // Each position against its reference, and its own most likely tokens when asked.
  double kl = 0.0, agree = 0.0;
  const int64_t k = std::min(kTopTokens, vocab);
  const PositionFn on_position = [&](int64_t i, std::span<const float> logits) {
    if (req->reference_size() > 0) {
      const v1::TopLogProbs& r = req->reference(static_cast<int>(i));
      kl += TopKl(ids_of(r), logp_of(r), logits);
      agree += TopAgrees(ids_of(r), logits) ? 1.0 : 0.0;
    }
    if (req->return_top()) {
      v1::TopLogProbs* top = reply->add_top();
      top->mutable_token_ids()->Resize(static_cast<int>(k), 0);
      top->mutable_logprobs()->Resize(static_cast<int>(k), 0.0f);
      TopLogProbs(logits, k, top->mutable_token_ids()->mutable_data(),
                  top->mutable_logprobs()->mutable_data());
    }
  };
  auto nll = [&]() -> absl::StatusOr<NllResult> {
    ASSIGN_OR_RETURN(std::unique_ptr<KvStore> work, engine_.CopyStore(*s.kv));
    std::vector<float> first = s.pending_logits;
    if (first.empty()) {
      ASSIGN_OR_RETURN(first,
                       scheduler_.Decode(WorkKind::kScore, s.tokens.back(), *work, Cancelled(ctx)));
    }
    return scheduler_.Score(ids, *work, first, Cancelled(ctx), on_position);
  }();
  if (!nll.ok()) return ToGrpc(nll.status());
  reply->set_mean_nll(nll->mean);
  reply->set_tokens(req->token_ids_size());
  if (req->reference_size() > 0) {
    reply->set_mean_kl(kl / static_cast<double>(req->reference_size()));
    reply->set_top1_agreement(agree / static_cast<double>(req->reference_size()));
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::Migrate(grpc::ServerContext* caller, const v1::MigrateRequest* req,
                                  v1::MigrateReply* reply) {
  const Stopwatch total;
  OwnerFilter mine;
  if (auto who = Authorize(caller, Action::kUseSessions, &mine); !who.ok()) {
    return ToGrpc(who.status());
  }
  if (req->target_address().empty()) return Bad("target_address is empty");
  if (!(req->timeout_seconds() >= 0 && req->timeout_seconds() <= 86400)) {
    return Bad("timeout_seconds must be in [0, 86400]");
  }
  MigrationMode mode = MigrationMode::kFullKv;
  std::string reason = "requested";
  const absl::StatusOr<WireForm> requested_form = WireFormFromProto(req->wire_form());
  if (!requested_form.ok()) return ToGrpc(requested_form.status());
  if (req->mode() != v1::AUTO) {
    auto m = FromProto(req->mode());
    if (!m.ok()) return ToGrpc(m.status());
    mode = *m;
  }
  // One snapshot of the policy for the whole call, and the rung RECONSTRUCT runs at: the one the
  // request names, or the policy's own.
  const std::shared_ptr<const Retention> retention = this->retention();
  const RetentionRung* rung = nullptr;
  WireForm full_kv_form = *requested_form;
  const bool names_rung = req->mode() == v1::RECONSTRUCT;
  if (req->has_rebuilt_groups() && !names_rung) {
    return Bad(
        "rebuilt_groups names a rung of the policy's ladder, which only RECONSTRUCT runs at");
  }
  if (req->has_rebuilt_groups() && retention == nullptr) {
    return Bad(
        "rebuilt_groups names a rung of a retention policy's ladder, and this node has none");
  }
  if (retention != nullptr) {
    const RetentionPolicy& own = retention->policy;
    // Without rebuilt_groups, wire_form is only the form of a FULL_KV fallback.
    const bool named =
        names_rung && req->has_rebuilt_groups() && req->wire_form() != v1::KV_WIRE_FORM_UNSPECIFIED;
    auto found = retention->FindRung(named ? *requested_form : PolicyWireForm(own),
                                     req->has_rebuilt_groups()
                                         ? req->rebuilt_groups()
                                         : static_cast<int32_t>(own.rebuilt_groups.size()));
    if (!found.ok()) return Bad(std::string(found.status().message()));
    rung = *found;
  }
  if (full_kv_form == WireForm::kTransform) {
    if (!names_rung) {
      return Bad(
          "wire_form: FULL_KV sends plain, int8 or int4; the transform form comes with a "
          "retention policy (RECONSTRUCT)");
    }
    full_kv_form = WireForm::kPlain;  // what a FULL_KV fallback sends
  }
  auto out = sessions_.BeginMigration(req->session_id(), mine);
  if (!out.ok()) return ToGrpc(out.status());
  // One identity's migrations in flight, counted while this call runs.
  const std::string owner = out->session().owner;
  const bool limited = options_.max_migrations_per_identity > 0 && access_.Limited(owner);
  if (limited) {
    absl::MutexLock lock(&migrating_mu_);
    if (migrating_[owner] >= options_.max_migrations_per_identity) {
      return ToGrpc(absl::ResourceExhaustedError(
          absl::StrCat("'", owner, "' has its limit of ", options_.max_migrations_per_identity,
                       " migrations in flight from this node")));
    }
    ++migrating_[owner];
  }
  struct Done {
    NodeService* self;
    std::string owner;
    bool limited;
    ~Done() {
      if (!limited) return;
      absl::MutexLock lock(&self->migrating_mu_);
      if (--self->migrating_[owner] == 0) self->migrating_.erase(owner);
    }
  } done{this, owner, limited};
  const int64_t history = out->history_tokens();
  // The modes to try in order. AUTO ranks them by estimate; a refused handshake (the target
  // lacks the bank or holds another policy version) moves on to the next, as a fallback does.
  std::vector<MigrationMode> attempts;
  double estimate = 0;
  if (req->mode() == v1::AUTO) {
    const ModelConfig& c = engine_.config();
    auto bytes = [&](WireForm form, int64_t layers) {
      return EstimateKvBytes(form, rung ? &rung->policy : nullptr, history, layers, c,
                             out->kv().dtype());
    };
    ModePlan plan = planner_.Rank(
        {.history_tokens = history,
         .full_kv_bytes = bytes(full_kv_form, c.n_layers),
         .reconstruct_bytes =
             rung ? bytes(rung->rung.form, static_cast<int64_t>(rung->policy.kept_layers.size()))
                  : -1,
         .target = req->target_address()});
    attempts = std::move(plan.modes);
    reason = std::move(plan.reason);
    estimate = plan.seconds;
  } else {
    attempts = {mode};
    for (MigrationMode m : {MigrationMode::kFullKv, MigrationMode::kTokenReplay}) {
      if (std::find(attempts.begin(), attempts.end(), m) == attempts.end()) attempts.push_back(m);
    }
  }
  if (!req->allow_fallback()) attempts.resize(1);
  const bool live = req->has_live()
                        ? req->live()
                        : req->mode() == v1::AUTO && estimate > options_.live_threshold_seconds;
  if (live && !req->has_live()) {
    reason = absl::StrCat(reason, "; live: the estimate exceeds ", options_.live_threshold_seconds,
                          " s");
  }
  const double timeout =
      req->timeout_seconds() > 0 ? req->timeout_seconds() : options_.default_timeout_seconds;
  const auto deadline = std::chrono::system_clock::now() + Seconds(timeout);
  absl::Status status;
  for (MigrationMode m : attempts) {
    bool refused = false;
    status = MigrateOnce(caller, *out, *req, m, full_kv_form, retention.get(), rung, live, deadline,
                         reply, &refused);
    if (status.ok()) {
      reply->set_mode(ToProto(m));
      reply->set_mode_reason(reason);
      reply->set_total_seconds(total.Seconds());
      if (metrics_) {
        metrics_->Migration("source", MigrationModeName(m), "ok", total.Seconds());
        metrics_->Downtime(MigrationModeName(m), live, reply->downtime_seconds());
      }
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
  // The session stays here, intact, and serves again when `out` lets it go.
  return ToGrpc(absl::Status(status.code(), absl::StrCat("migration of '", req->session_id(),
                                                         "' failed, the session stays on this "
                                                         "node: ",
                                                         status.message())));
}

absl::Status NodeService::MigrateOnce(grpc::ServerContext* caller, SessionTable::Outbound& out,
                                      const v1::MigrateRequest& req, MigrationMode mode,
                                      WireForm full_kv_form, const Retention* retention,
                                      const RetentionRung* rung, bool live,
                                      std::chrono::system_clock::time_point deadline,
                                      v1::MigrateReply* reply, bool* refused) {
  *refused = false;
  if (mode == MigrationMode::kReconstruct && rung == nullptr) {
    *refused = true;  // nothing moved; a fallback may still run
    return absl::FailedPreconditionError(
        "this node has no retention policy for RECONSTRUCT (start it with --policy or --control)");
  }
  const absl::Time until = absl::FromChrono(deadline);
  // Stop-and-copy pauses the session for the whole migration; live copies it as it decodes
  // and pauses it only for the rows added since the last round.
  std::vector<int32_t> tokens;
  std::optional<Sampler> sampler;
  if (!live) RETURN_IF_ERROR(out.Pause(until));
  if (out.paused()) {
    tokens = out.session().tokens;
    sampler = out.session().sampler;
  } else {
    out.Snapshot(&tokens, &sampler);
  }
  OutboundHandOver hand_over(out);
  MigrationSender sender({&out.kv(), tokens, &*sampler},
                         {.mode = mode,
                          .model_fingerprint = options_.model_fingerprint,
                          .migration_id = RandomId(),
                          .owner = out.session().owner,
                          .policy = rung ? &rung->policy : nullptr,
                          .bank = retention ? retention->bank.get() : nullptr,
                          .wire_form = full_kv_form,
                          .max_chunk_bytes = options_.max_chunk_bytes,
                          .pace = [this](int64_t bytes) { link_.Acquire(bytes); },
                          .live = live,
                          .pause_rows = options_.live_pause_rows,
                          .max_rounds = options_.live_max_rounds},
                         &hand_over);
  BetweenRounds between = [&](MigrationSender& s) -> absl::Status {
    out.Snapshot(&tokens, &sampler);
    const auto history = static_cast<int64_t>(tokens.size()) - 1;
    if (!s.ShouldPause(history)) return s.NextRound(tokens);
    // A quantized round ends on a whole token group: a session still generating is let reach
    // the next one, so the pause sends only the rows made while that round went out.
    if (const int64_t group_end = s.AwaitGroupEnd(history);
        group_end > 0 && out.AwaitHistory(group_end, kGeneratingGap, until) >= group_end) {
      out.Snapshot(&tokens, &sampler);
      return s.NextRound(tokens);
    }
    RETURN_IF_ERROR(out.Pause(until));
    const NodeSession& paused = out.session();
    return s.Pause(paused.tokens, *paused.sampler);
  };
  SendOutcome outcome;
  const absl::Status status =
      RunMigration(sender,
                   {.target = req.target_address(),
                    .credentials = options_.peer_credentials,
                    .token = options_.peer_token,
                    .deadline = deadline,
                    .cancelled = [caller] { return caller->IsCancelled(); },
                    .in_doubt_seconds = options_.in_doubt_seconds,
                    .stopping = [this] { return stopping_.load(); },
                    .on_in_doubt =
                        [this, &req](bool begins) {
                          if (begins) {
                            spdlog::warn(
                                "migration of '{}' to {}: the target cannot be asked whether it "
                                "took the session after its commit; the session is held here, "
                                "served by neither node, until it answers",
                                req.session_id(), req.target_address());
                          }
                          if (metrics_) metrics_->SessionsInDoubt(begins ? 1 : -1);
                        }},
                   &outcome, live ? between : nullptr);
  const double downtime = out.paused_seconds();
  *refused = outcome.refused;
  if (!status.ok() && live) out.Unpause();  // the session decodes on here
  if (outcome.resumed) {
    const v1::MigrationHandshake& h = sender.handshake();
    const ModelConfig& c = engine_.config();
    reply->set_transfer_seconds(outcome.transfer_seconds);
    reply->set_kv_bytes_sent(sender.bytes_sent());
    reply->set_wire_form(h.wire_form());
    reply->set_history_tokens(sender.rows_sent());
    reply->set_live(live);
    reply->set_precopy_rounds(sender.rounds());
    reply->set_kv_bytes_before_pause(sender.bytes_before_pause());
    reply->set_kv_bytes_after_pause(sender.bytes_sent() - sender.bytes_before_pause());
    if (mode == MigrationMode::kReconstruct) {
      // In the form the kept layers went in: what the policy saved, the form's own share aside.
      reply->set_kv_bytes_omitted(EstimateKvBytes(sender.wire_form(), &rung->policy,
                                                  sender.rows_sent(), c.n_layers - h.layers_size(),
                                                  c, out.kv().dtype()));
      reply->set_rebuilt_groups(rung->rung.groups);
      reply->set_rung_delta_nll(rung->rung.delta_nll.mean);
    }
    reply->set_rebuild_seconds(sender.resumed().rebuild_seconds());
    reply->set_recovery_seconds(sender.resumed().recovery_seconds());
    // A live transfer's time includes the rounds' waits: it says nothing of the link.
    planner_.MeasurePeer(req.target_address(), static_cast<double>(sender.bytes_sent()),
                         live ? 0.0 : outcome.send_seconds,
                         sender.accepted().prefill_seconds_per_token(),
                         sender.accepted().rebuild_seconds_per_token());
    if (metrics_) {
      metrics_->Transfer(MigrationModeName(mode), reply->transfer_seconds(),
                         static_cast<double>(reply->kv_bytes_sent()),
                         static_cast<double>(reply->kv_bytes_omitted()));
    }
  }
  if (!status.ok()) return status;
  reply->set_downtime_seconds(downtime);
  reply->set_target_session_id(sender.target_session_id());
  out.Moved({.target_address = req.target_address(), .session_id = sender.target_session_id()});
  return absl::OkStatus();
}

grpc::Status NodeService::Receive(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream) {
  if (auto who = Authorize(ctx, Action::kReceiveSessions); !who.ok()) {
    if (metrics_) metrics_->Failure("target", "unauthorized");
    return ToGrpc(who.status());
  }
  if (receiving_.fetch_add(1) >= options_.max_concurrent_receives) {
    receiving_.fetch_sub(1);
    if (metrics_) metrics_->Failure("target", "busy");
    return ToGrpc(absl::ResourceExhaustedError(
        absl::StrCat("this node is already receiving its limit of ",
                     options_.max_concurrent_receives, " migrations")));
  }
  // The caller's deadline, but never longer than this node's own bound.
  const auto bound = std::chrono::system_clock::now() + Seconds(options_.default_timeout_seconds);
  grpc::Status st;
  {
    ReceiveWatchdog watchdog([ctx] { ctx->TryCancel(); }, std::min(bound, ctx->deadline()),
                             Seconds(options_.receive_idle_seconds),
                             Seconds(options_.receive_handshake_seconds), ReceiveRate(options_));
    st = ReceiveMigration(
        {.engine = &engine_,
         .model_fingerprint = options_.model_fingerprint,
         .retention = retention(),
         .capacity = options_.capacity,
         .max_chunk_bytes = options_.max_chunk_bytes,
         .scheduler = &scheduler_,
         .sessions = &sessions_,
         .budget = &budget_,
         .outcomes = &outcomes_,
         .planner = &planner_,
         .metrics = metrics_,
         .bounds = {.deadline_seconds = options_.default_timeout_seconds,
                    .handshake_seconds = options_.receive_handshake_seconds,
                    .idle_seconds = options_.receive_idle_seconds,
                    .min_receive_bytes_per_second = options_.min_receive_bytes_per_second}},
        stream, watchdog);
  }
  receiving_.fetch_sub(1);
  return st;
}

grpc::Status NodeService::MigrationOutcome(grpc::ServerContext* ctx,
                                           const v1::MigrationOutcomeRequest* req,
                                           v1::MigrationOutcomeReply* reply) {
  if (auto who = Authorize(ctx, Action::kReceiveSessions); !who.ok()) {
    return ToGrpc(who.status());
  }
  const std::string& id = req->migration_id();
  if (auto st = CheckMigrationId(id, /*required=*/true); !st.ok()) return ToGrpc(st);
  MigrationOutcomes::Answer answer = outcomes_.Ask(id);
  if (answer.session) {
    reply->set_committed(true);
    reply->set_session_id(*answer.session);
  }
  reply->set_failure(std::move(answer.failure));
  return grpc::Status::OK;
}

}  // namespace riskkv
