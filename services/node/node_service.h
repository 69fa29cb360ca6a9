// riskkv-node's gRPC service: decoding sessions, and the source and target roles of a migration
// with a two-phase hand-over (the source serves a session until the target confirms it took it
// over; a failed, refused or timed-out migration leaves it on the source, intact).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/recovery/predictor_bank.h"
#include "common/model/sampler.h"
#include "riskkv/v1/node.grpc.pb.h"
#include "riskkv/v1/retention_policy.pb.h"
#include "services/grpc_status.h"
#include "services/migration/migration.h"
#include "services/node/node_metrics.h"
#include "services/node/retention.h"

namespace riskkv {

// A sender-side token bucket emulating a link of fixed rate; shared by a node's migrations.
class RateLimiter {
 public:
  // bits_per_second <= 0: unlimited. Bursts up to `burst_bytes`.
  RateLimiter(double bits_per_second, double burst_bytes = 64 * 1024);
  // Blocks until `bytes` may be sent.
  void Acquire(int64_t bytes);
  double bytes_per_second() const { return rate_; }

 private:
  std::mutex mu_;
  double rate_;
  double burst_;
  double tokens_;
  std::chrono::steady_clock::time_point last_;
};

struct NodeOptions {
  std::string model_fingerprint;
  // Sessions live on this GPU model when set (prefill, decode, KV, rebuilds); the CPU Model
  // then only tokenizes. Not owned.
  GpuModel* gpu = nullptr;
  std::shared_ptr<const Retention> retention;  // RECONSTRUCT needs one (see SetRetention)
  DType kv_dtype = DType::kF32;
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
  // How this node reaches migration targets (null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials;
  int max_sessions = 64;
  // Speeds AUTO assumes before any measurement (seconds per history token).
  double prefill_seconds_per_token = 3e-3;
  double rebuild_seconds_per_token = 1.5e-4;
  // Measure them (this node's prefills and rebuilds, each target's transfer rate and reported
  // speeds) and let AUTO use the measurements; false pins the values above.
  bool measure_speeds = true;
};

class NodeService final : public v1::Node::Service {
 public:
  // `metrics` may be null (no metrics).
  NodeService(Model& model, NodeOptions options, NodeMetrics* metrics);

  // Replaces the policy and bank (null: none). Migrations already running keep the pair they
  // started with; later ones, in either role, use the new one.
  void SetRetention(std::shared_ptr<const Retention> retention);
  std::shared_ptr<const Retention> retention() const;

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

 private:
  struct Session {
    std::mutex mu;
    // Either every token but the last has its KV row (the last is fed by the next decode step),
    // or every token has, and pending_logits hold the next token's logits (after a prefill or a
    // migration, before the next Generate).
    std::unique_ptr<KvCache> cache;   // on a CPU node
    std::unique_ptr<GpuSession> gpu;  // on a GPU node
    std::vector<int32_t> tokens;
    std::vector<float> pending_logits;
    std::optional<Sampler> sampler;
    int64_t generated = 0;
    bool busy = false;  // generating or migrating
  };

  // The compute backend's view of a session: its KV capacity, the bytes of one K (or V) row of a
  // layer, a fresh KV cache with the session's prefix run through the model, a decode step.
  int64_t Capacity(const Session& s) const;
  int64_t RowBytes(const Session& s) const;
  absl::Status NewKv(Session& s, int64_t capacity);
  absl::StatusOr<std::vector<float>> Prefill(Session& s, std::span<const int32_t> tokens);
  absl::StatusOr<std::vector<float>> DecodeLast(Session& s);
  // A GPU session's KV copied to host memory (for sending).
  absl::StatusOr<std::unique_ptr<KvCache>> HostKv(Session& s);
  // `to` gets a copy of `from`'s tokens and KV on the same backend (for work that must leave
  // `from` as it was).
  absl::Status CopyKv(Session& from, Session& to);
  // The session and its lock, or NOT_FOUND / FAILED_PRECONDITION (busy).
  absl::StatusOr<std::shared_ptr<Session>> Acquire(const std::string& id);
  void Release(const std::shared_ptr<Session>& s);
  // Adds a session under a new id; RESOURCE_EXHAUSTED when the node serves max_sessions.
  absl::StatusOr<std::string> Register(std::shared_ptr<Session> s);
  void Fill(const std::string& id, const Session& s, bool with_tokens, v1::SessionInfo* info);
  // One attempt in `mode`: handshake, KV, resume, commit. Sets *refused when the target turned
  // the handshake down (nothing moved).
  absl::Status MigrateOnce(grpc::ServerContext* caller, Session& s, const std::string& id,
                           const v1::MigrateRequest& req, MigrationMode mode,
                           std::chrono::system_clock::time_point deadline, v1::MigrateReply* reply,
                           bool* refused);
  // Cancels a receive at its deadline or when its source goes idle (node_service.cc).
  class Watchdog;
  // Receive's work once the admission limit let the call in; `watchdog` hears of every frame and
  // is disarmed before the session is registered.
  grpc::Status ReceiveAdmitted(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream, Watchdog& watchdog);
  // AUTO: the modes ranked by estimated time to `target` (RECONSTRUCT only with a policy),
  // fastest first; *reason gives the estimates and where each input came from.
  std::vector<MigrationMode> RankModes(const Session& s, const Retention* retention,
                                       const std::string& target, std::string* reason) const;
  // Speed measurements (exponentially weighted; no-ops unless options_.measure_speeds).
  void MeasurePrefill(double seconds, int64_t tokens);
  void MeasureRebuild(double seconds, int64_t tokens);
  void MeasurePeer(const std::string& target, double bytes, double seconds,
                   const v1::HandshakeAccepted& accepted);
  void CountSessions();  // mu_ held

  Model& model_;
  NodeOptions options_;
  NodeMetrics* metrics_;
  RateLimiter link_;
  std::mutex model_mu_;  // one forward pass at a time (the backend's scratch is shared)
  // What AUTO knows of speeds: this node's own, and per target address the transfer rate seen
  // and the speeds the target reported (0: not measured).
  struct Peer {
    double bytes_per_second = 0;
    double prefill_seconds_per_token = 0;
    double rebuild_seconds_per_token = 0;
  };
  mutable std::mutex speed_mu_;
  double prefill_spt_;
  double rebuild_spt_;
  bool prefill_measured_ = false;
  bool rebuild_measured_ = false;
  std::map<std::string, Peer> peers_;

  mutable std::mutex retention_mu_;
  std::shared_ptr<const Retention> retention_;  // options_.retention is moved here
  std::atomic<int> receiving_{0};
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  uint64_t next_id_ = 1;
  std::string id_prefix_;
};

}  // namespace riskkv
