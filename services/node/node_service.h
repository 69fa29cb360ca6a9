// riskkv-node's gRPC service: the RPC handlers over the node's parts: the engine, the session
// table, AUTO's planner, the link limiter, and both roles of a migration (the source's sender in
// migration_source.h, the target's receiver in migration_target.h). A hand-over has two phases:
// the source serves a session until the target confirms it took it over; a failed, refused or
// timed-out migration leaves it on the source, intact.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/engine/scheduler.h"
#include "riskkv/v1/node.grpc.pb.h"
#include "services/access/access_file.h"
#include "services/access/authorizer.h"
#include "services/access/client_token.h"
#include "services/node/migration_outcomes.h"
#include "services/node/mode_planner.h"
#include "services/node/node_metrics.h"
#include "services/node/rate_limiter.h"
#include "services/node/retention.h"
#include "services/node/session_reaper.h"
#include "services/node/session_table.h"

namespace riskkv {

struct NodeOptions {
  std::string model_fingerprint;
  std::shared_ptr<const Retention> retention;  // RECONSTRUCT needs one (see SetRetention)
  // How the engine's steps are formed: the token budget, the prefill chunk (see scheduler.h).
  SchedulerOptions scheduler;
  // The node's activation precision ("int8" or "f32"; empty: not said): a policy whose ΔNLL was
  // measured in another is logged as a warning when it is set.
  std::string activations;
  int64_t capacity = 0;  // KV rows per session (0: the model's context)
  double link_mbps = 0;  // sender-side rate limit (0: none)
  int64_t max_chunk_bytes = 256 << 10;
  // A migration's deadline when the caller sets none; also the longest a Receive may run.
  double default_timeout_seconds = 120;
  // Incoming migrations received at once; more are refused (RESOURCE_EXHAUSTED).
  int max_concurrent_receives = 4;
  // A receive whose source sends nothing this long is cut off (a stalled peer must not hold a
  // slot until the deadline). One chunk must cross the link in less.
  double receive_idle_seconds = 60;
  // A receive whose handshake does not arrive within this long is cut off.
  double receive_handshake_seconds = 10;
  // After its handshake, a receive whose source sends slower than this (bytes per second of the
  // time this node waits on it, past a grace period; 0: no minimum) is cut off.
  double min_receive_bytes_per_second = 32 << 10;
  // The grace before the minimum rate applies: this at least, and twice one largest chunk's time
  // at the minimum rate.
  double receive_rate_grace_seconds = 10;
  // How this node reaches migration targets (null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
  // The bearer token this node presents to migration targets (null: none).
  std::shared_ptr<TokenFile> peer_token;
  // Who may call this node, and as what (null: everyone, as an anonymous operator).
  std::shared_ptr<AccessFile> access_file;
  int max_sessions = 64;
  // What one identity (a session's owner) may hold at once: sessions on this node, and
  // migrations of its sessions in flight from it (0: no limit of its own).
  int max_sessions_per_identity = 0;
  int max_migrations_per_identity = 0;
  // KV bytes that sessions and receives may hold together (0: no limit but capacity and
  // max_sessions); a call that would pass it is refused (RESOURCE_EXHAUSTED).
  int64_t kv_budget_bytes = 0;
  // A session no call or migration used for this long is closed (seconds; 0: never).
  double session_idle_ttl_seconds = 3600;
  // Live migration: AUTO pre-copies when its estimate of the transfer exceeds this (seconds;
  // a request's `live` overrides); the pause comes once a round would carry at most
  // live_pause_rows rows, or after live_max_rounds rounds.
  double live_threshold_seconds = 0.1;
  int64_t live_pause_rows = 4;
  int live_max_rounds = 8;
  // A source whose commit went unconfirmed and whose target cannot be asked about it before the
  // migration's deadline holds the session (served nowhere for sure) and asks on for this long
  // (seconds; 0: until the target answers or the node stops), then serves it here again.
  double in_doubt_seconds = 0;
  // Called before each token a Generate computes (tests pace a generator with it; may be null).
  std::function<void()> generate_step;
  // Speeds AUTO assumes before any measurement (seconds per history token).
  double prefill_seconds_per_token = 3e-3;
  double rebuild_seconds_per_token = 1.5e-4;
  // Measure them (this node's prefills and rebuilds, each target's transfer rate and reported
  // speeds) and let AUTO use the measurements; false pins the values above.
  bool measure_speeds = true;
};

class NodeService final : public v1::Node::Service {
 public:
  // `engine` must outlive the service; `metrics` may be null (no metrics).
  NodeService(Engine& engine, NodeOptions options, NodeMetrics* metrics);

  // Replaces the policy and bank (null: none), preparing the bank for the engine. Migrations
  // already running keep the pair they started with; later ones, in either role, use the new one.
  void SetRetention(std::shared_ptr<const Retention> retention) ABSL_LOCKS_EXCLUDED(retention_mu_);
  std::shared_ptr<const Retention> retention() const ABSL_LOCKS_EXCLUDED(retention_mu_);
  // The node is shutting down: a source holding a session in doubt stops asking its target (the
  // session ends with the process, as every other), so the server's shutdown is not held up.
  void BeginShutdown() { stopping_ = true; }

  grpc::Status StartSession(grpc::ServerContext*, const v1::StartSessionRequest*,
                            v1::SessionInfo*) override;
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest*,
                        grpc::ServerWriter<v1::GenerateReply>*) override;
  grpc::Status GetSession(grpc::ServerContext*, const v1::GetSessionRequest*,
                          v1::SessionInfo*) override;
  grpc::Status ListSessions(grpc::ServerContext*, const v1::ListSessionsRequest*,
                            v1::ListSessionsReply*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const v1::CloseSessionRequest*,
                            v1::CloseSessionReply*) override;
  grpc::Status Score(grpc::ServerContext*, const v1::ScoreRequest*, v1::ScoreReply*) override;
  grpc::Status Migrate(grpc::ServerContext*, const v1::MigrateRequest*, v1::MigrateReply*) override;
  grpc::Status Receive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream) override;
  grpc::Status MigrationOutcome(grpc::ServerContext*, const v1::MigrationOutcomeRequest*,
                                v1::MigrationOutcomeReply*) override;

 private:
  void Fill(const std::string& id, const NodeSession& s, bool with_tokens,
            v1::SessionInfo* info) const;
  // Who calls and whether it may do `action`; *owner is then the sessions it may touch.
  absl::StatusOr<Principal> Authorize(grpc::ServerContext* ctx, Action action,
                                      OwnerFilter* owner = nullptr) const;
  // One attempt in `mode` over `out`'s session, FULL_KV in `full_kv_form`, RECONSTRUCT at `rung`
  // of `retention` (null without one), live or stop-and-copy. *refused when the target turned
  // the handshake down (nothing moved).
  absl::Status MigrateOnce(grpc::ServerContext* caller, SessionTable::Outbound& out,
                           const v1::MigrateRequest& req, MigrationMode mode, WireForm full_kv_form,
                           const Retention* retention, const RetentionRung* rung, bool live,
                           std::chrono::system_clock::time_point deadline, v1::MigrateReply* reply,
                           bool* refused);

  Engine& engine_;
  NodeOptions options_;  // its retention is moved out at construction
  NodeMetrics* const metrics_;
  const Authorizer access_;
  // Every call's engine work goes through it; it outlives the sessions whose stores it runs.
  Scheduler scheduler_;
  KvBudget budget_;  // before sessions_: their charges return to it as they go
  SessionTable sessions_;
  std::unique_ptr<SessionReaper> reaper_;  // null without a TTL; stops before sessions_ goes
  ModePlanner planner_;
  RateLimiter link_;
  std::atomic<int> receiving_{0};
  std::atomic<bool> stopping_{false};
  // Migrations in flight from this node, by the identity whose session moves.
  mutable absl::Mutex migrating_mu_;
  std::map<std::string, int> migrating_ ABSL_GUARDED_BY(migrating_mu_);
  MigrationOutcomes outcomes_;  // of the migrations this node received
  mutable absl::Mutex retention_mu_;
  std::shared_ptr<const Retention> retention_ ABSL_GUARDED_BY(retention_mu_);
};

}  // namespace riskkv
