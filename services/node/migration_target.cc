// The target role's transport (see migration_target.h).
#include "services/node/migration_target.h"

#include <chrono>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/stopwatch.h"
#include "services/grpc_status.h"
#include "services/migration/migration_receiver.h"

namespace riskkv {

std::string CutOffMessage(const ReceiveBounds& bounds, const ReceiveWatchdog::Firing& fired) {
  if (fired.bound == "deadline") {
    return absl::StrCat("the migration did not finish within the target's bound of ",
                        bounds.deadline_seconds, " s; nothing was applied");
  }
  if (fired.bound == "no_handshake") {
    return absl::StrCat("no handshake within ", bounds.handshake_seconds,
                        " s; nothing was applied");
  }
  if (fired.bound == "slow") {
    return absl::StrCat("the source sent ", fired.received_bytes, " bytes in ",
                        absl::SixDigits(fired.waited_seconds),
                        " s of waiting on it, below the target's minimum of ",
                        bounds.min_receive_bytes_per_second, " bytes/s; nothing was applied");
  }
  return absl::StrCat("the source sent nothing for ", bounds.idle_seconds,
                      " s; nothing was applied");
}

grpc::Status ReceiveMigration(
    const TargetSide& side, grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream,
    ReceiveWatchdog& watchdog) {
  const Stopwatch whole;
  NodeMetrics* metrics = side.metrics;
  auto fail = [&](const std::string& reason, const absl::Status& s) {
    if (metrics) {
      metrics->Failure("target", reason);
      metrics->Migration("target", "unknown", "failed", 0);
    }
    return ToGrpc(s);
  };
  // When the watchdog cancelled the call, its bound is why the stream ended, not the source. The
  // source sees only a cancelled stream, so the reason is recorded where it asks for the
  // migration's outcome: by the watchdog itself before it cancels, once the handshake named the
  // migration (see below), and here too in case it fired before that.
  auto cut_off = [&](const std::string& migration_id) -> std::optional<grpc::Status> {
    const std::optional<ReceiveWatchdog::Firing> fired = watchdog.fired();
    if (!fired) return std::nullopt;
    std::string why = CutOffMessage(side.bounds, *fired);
    if (!migration_id.empty() && side.outcomes != nullptr) side.outcomes->CutOff(migration_id, why);
    return fail(fired->bound, absl::DeadlineExceededError(why));
  };
  bool hooked = false;
  auto record_cut_offs = [&](const std::string& migration_id) {
    if (hooked || migration_id.empty() || side.outcomes == nullptr) return;
    hooked = true;
    // Copies only: the watchdog outlives this call, and the outcomes outlive the watchdog.
    watchdog.OnFire([outcomes = side.outcomes, migration_id,
                     bounds = side.bounds](const ReceiveWatchdog::Firing& f) {
      outcomes->CutOff(migration_id, CutOffMessage(bounds, f));
    });
  };
  v1::MigrationFrame f;
  if (!stream->Read(&f)) {
    if (auto cut = cut_off("")) return *cut;
    return ToGrpc(absl::InvalidArgumentError("the stream carried no handshake"));
  }
  watchdog.Touch();
  if (auto room = side.sessions->CheckRoom(f.has_handshake() ? f.handshake().owner() : "");
      !room.ok()) {
    return fail("session_limit", room);
  }
  const Retention* r = side.retention.get();
  std::string migration_id;  // the handshake's, once the session was adopted
  // The rows the stream asks this node to hold, against its KV budget; the session takes it over.
  KvBudget::Charge charge =
      side.budget ? side.budget->Open(KvBudget::State::kReceiving) : KvBudget::Charge();
  // From the commit on the session is registered: the deadline may no longer cancel the call.
  auto adopt = [&](ResumedSession resumed) -> absl::StatusOr<std::string> {
    if (!watchdog.Disarm()) {
      return absl::DeadlineExceededError("the node's receive deadline passed");
    }
    auto s = std::make_unique<NodeSession>();
    s->kv = std::move(resumed.kv);
    s->tokens = std::move(resumed.tokens);
    s->sampler = std::move(resumed.sampler);
    s->owner = std::move(resumed.owner);
    // The first decode step already ran: its logits give the next token.
    s->pending_logits = std::move(resumed.logits);
    s->charge = std::move(charge);
    s->charge.MoveTo(KvBudget::State::kSessions);
    migration_id = resumed.migration_id;
    auto add = [&] { return side.sessions->Add(std::move(s)); };
    // Recorded under its migration id, unless its source already gave up asking about it.
    if (migration_id.empty() || side.outcomes == nullptr) return add();
    return side.outcomes->Commit(migration_id, add);
  };
  auto on_resumed = [&](const ResumeFigures& fig) {
    if (fig.prefill_seconds > 0) {
      side.planner->MeasurePrefill(fig.prefill_seconds, fig.history_tokens);
    }
    if (fig.rebuild_seconds > 0) {
      side.planner->MeasureRebuild(fig.rebuild_seconds, fig.history_tokens);
    }
  };
  std::vector<TargetRung> rungs;
  if (r != nullptr) {
    for (const RetentionRung& rung : r->rungs) rungs.push_back({&rung.policy, &rung.groups});
  }
  MigrationReceiver rx({
      .engine = side.engine,
      .model_fingerprint = side.model_fingerprint,
      .policy = r ? &r->policy : nullptr,
      .bank = r ? r->bank.get() : nullptr,
      .groups = r ? &r->groups : nullptr,
      .predictors = r ? r->predictors.get() : nullptr,
      .rungs = std::move(rungs),
      .capacity = side.capacity,
      .max_chunk_bytes = side.max_chunk_bytes,
      .scheduler = side.scheduler,
      .prefill_seconds_per_token = side.planner->measured_prefill_seconds_per_token(),
      .rebuild_seconds_per_token = side.planner->measured_rebuild_seconds_per_token(),
      .adopt = adopt,
      .on_resumed = on_resumed,
  });
  while (true) {
    // Checking a handshake or a complete anchor set may start work here.
    watchdog.Busy(static_cast<int64_t>(f.ByteSizeLong()));
    auto reply = rx.OnFrame(f);
    watchdog.Touch();
    if (reply.ok()) record_cut_offs(rx.migration_id());
    if (reply.ok() && !rx.committed()) {
      if (absl::Status charged = charge.GrowTo(rx.rows_reached()); !charged.ok()) {
        return fail("kv_budget", charged);
      }
    }
    if (!reply.ok()) {
      // A refused handshake (on any ground, its wire form included) moved no KV.
      const std::string& reason = rx.failure_reason();
      if (reason != "handshake" && reason != "wire_form") return fail(reason, reply.status());
      if (metrics) {
        metrics->Failure("target", reason);
        metrics->Migration("target", rx.mode() ? MigrationModeName(*rx.mode()) : "unknown",
                           "refused", 0);
      }
      return ToGrpc(reply.status());
    }
    if (reply->has_value() && !stream->Write(**reply) && rx.committed()) {
      // The source cannot learn that we took the session over, so it keeps serving it; unless it
      // already asked and was told we did.
      auto drop = [&] { side.sessions->Erase(rx.session_id()); };
      if (migration_id.empty() || side.outcomes == nullptr) {
        drop();
      } else if (!side.outcomes->Revoke(migration_id, drop)) {
        break;
      }
      return fail("not_committed", absl::AbortedError("the commit confirmation could not be sent"));
    }
    if (rx.committed()) break;
    if (!stream->Read(&f)) {
      rx.OnStreamEnd();
      if (auto cut = cut_off(rx.migration_id())) return *cut;
      return fail(rx.failure_reason(),
                  absl::AbortedError(rx.failure_reason() == "not_committed"
                                         ? "the source did not commit; the resumed session was "
                                           "dropped"
                                         : "the stream ended before its trailer; nothing was "
                                           "applied"));
    }
  }
  if (metrics) {
    const char* mode = MigrationModeName(*rx.mode());
    const ResumeFigures& fig = rx.figures();
    metrics->Migration("target", mode, "ok", whole.Seconds());
    metrics->Recovery(mode, fig.recovery_seconds);
    if (fig.rebuild_seconds > 0) metrics->Rebuild(fig.rebuild_seconds);
  }
  return grpc::Status::OK;
}

}  // namespace riskkv
