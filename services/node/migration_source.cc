// The source role's transport (see migration_source.h).
#include "services/node/migration_source.h"

#include <algorithm>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/base/stopwatch.h"
#include "riskkv/v1/node.grpc.pb.h"
#include "services/grpc_status.h"

namespace riskkv {
namespace {

// One MigrationOutcome question, answered by `deadline` at the latest.
grpc::Status AskOnce(v1::Node::Stub& target, const std::string& id,
                     std::chrono::system_clock::time_point deadline,
                     v1::MigrationOutcomeReply* reply) {
  v1::MigrationOutcomeRequest req;
  req.set_migration_id(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  return target.MigrationOutcome(&ctx, req, reply);
}

bool Transient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// The target's answer to "did migration `id` commit?", asked until `deadline` while it cannot be
// reached (and `stopping`, if given, is false): the session's id there, or nullopt (it did not,
// and now never will).
absl::StatusOr<std::optional<std::string>> AskOutcome(
    v1::Node::Stub& target, const std::string& id, std::chrono::system_clock::time_point deadline,
    const std::function<bool()>& stopping = nullptr) {
  auto pause = std::chrono::milliseconds(200);
  while (true) {
    v1::MigrationOutcomeReply reply;
    const grpc::Status st = AskOnce(
        target, id, std::min(deadline, std::chrono::system_clock::now() + std::chrono::seconds(2)),
        &reply);
    if (st.ok()) {
      return reply.committed() ? std::optional<std::string>(reply.session_id()) : std::nullopt;
    }
    if (!Transient(st.error_code()) || (stopping && stopping()) ||
        std::chrono::system_clock::now() + pause >= deadline) {
      return FromGrpc(st);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(2));
  }
}

// When the target cut the stream off itself (its deadline, handshake or idle bound), the source
// sees only a cancelled stream; the target recorded why under the migration's id. One question,
// bounded by a second: a target that is gone gives no reason.
std::optional<std::string> CutOffReason(v1::Node::Stub& target, const std::string& id) {
  if (id.empty()) return std::nullopt;
  v1::MigrationOutcomeReply reply;
  if (!AskOnce(target, id, std::chrono::system_clock::now() + std::chrono::seconds(1), &reply)
           .ok() ||
      reply.failure().empty()) {
    return std::nullopt;
  }
  return reply.failure();
}

}  // namespace

absl::Status RunMigration(MigrationSender& sender, const SourceLink& link, SendOutcome* out,
                          const BetweenRounds& between_rounds) {
  *out = {};
  auto cancelled = [&] { return link.cancelled && link.cancelled(); };
  absl::StatusOr<v1::MigrationFrame> handshake = sender.Handshake();
  if (!handshake.ok()) return handshake.status();
  auto channel = OpenChannel(
      link.target, link.credentials ? link.credentials : grpc::InsecureChannelCredentials(),
      link.token);
  auto stub = v1::Node::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(link.deadline);
  auto stream = stub->Receive(&ctx);
  // Ends the stream after a failure on this side; `cancel` when the target may still be waiting
  // for frames.
  auto finish = [&](const std::string& what, bool cancel = true) {
    sender.Abort();
    if (cancel) ctx.TryCancel();
    const grpc::Status st = stream->Finish();
    if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED) {
      return absl::Status(FromGrpc(st).code(), what + ": " + st.error_message());
    }
    if (!cancelled()) {
      if (std::optional<std::string> why = CutOffReason(*stub, sender.handshake().migration_id())) {
        return absl::DeadlineExceededError(what + ": the target cut the stream off: " + *why);
      }
    }
    return absl::UnavailableError(what);
  };
  v1::ReceiveReply reply;
  if (!stream->Write(*handshake) || !stream->Read(&reply)) {
    sender.Abort();
    stream->WritesDone();
    const grpc::Status st = stream->Finish();
    out->refused = st.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
    return absl::Status(st.ok() ? absl::StatusCode::kUnavailable : FromGrpc(st).code(),
                        "target " + link.target + " refused the handshake: " +
                            (st.ok() ? std::string("stream closed") : st.error_message()));
  }
  if (!sender.OnReply(reply).ok()) return finish("target answered the handshake out of protocol");
  const Stopwatch wire;  // from the first chunk
  while (true) {
    if (cancelled()) return finish("the caller cancelled the migration");
    absl::StatusOr<std::optional<v1::MigrationFrame>> frame = sender.NextFrame();
    if (!frame.ok()) return finish(std::string(frame.status().message()));
    if (!frame->has_value() && sender.state() == MigrationSender::State::kAwaitRoundDone) {
      if (!stream->Read(&reply) || !sender.OnReply(reply).ok()) {
        return finish("target did not apply a pre-copy round");
      }
      const absl::Status next = between_rounds ? between_rounds(sender)
                                               : absl::InternalError(
                                                     "a live migration with no "
                                                     "rounds driver");
      if (!next.ok()) {
        (void)finish(std::string(next.message()));
        return next;
      }
      continue;
    }
    if (!frame->has_value()) break;
    if (!stream->Write(**frame)) {
      return finish("the stream to the target broke", /*cancel=*/false);
    }
  }
  out->send_seconds = wire.Seconds();
  if (!stream->Read(&reply) || !sender.OnReply(reply).ok()) {
    return finish("target did not resume the session");
  }
  out->resumed = true;
  out->transfer_seconds = wire.Seconds();
  if (cancelled()) return finish("the caller cancelled the migration");
  // Second phase: stop serving here, then hand over. Once the target said `committed` it serves
  // the session, whatever happens to the stream; without it the session comes back.
  absl::StatusOr<v1::MigrationFrame> commit = sender.Commit();
  if (!commit.ok()) return finish(std::string(commit.status().message()));
  const bool committed = stream->Write(*commit) && stream->WritesDone() && stream->Read(&reply) &&
                         sender.OnReply(reply).ok();
  const grpc::Status st = stream->Finish();
  if (committed) return absl::OkStatus();
  std::string asked;
  if (sender.state() == MigrationSender::State::kAwaitCommitted &&
      !sender.handshake().migration_id().empty()) {
    // No confirmation came back: only the target knows whether it took the session, so it is
    // asked (which also makes it refuse a commit still on its way) before the session comes back.
    const std::string& id = sender.handshake().migration_id();
    absl::StatusOr<std::optional<std::string>> taken = AskOutcome(*stub, id, link.deadline);
    if (!taken.ok() && (taken.status().code() == absl::StatusCode::kUnavailable ||
                        taken.status().code() == absl::StatusCode::kDeadlineExceeded)) {
      // In doubt: the target may serve the session already. It stays withdrawn here until the
      // target answers (or the hold ends), so it is never served twice.
      if (link.on_in_doubt) link.on_in_doubt(true);
      const Stopwatch held;
      const auto until = link.in_doubt_seconds > 0
                             ? std::chrono::system_clock::now() +
                                   std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                       std::chrono::duration<double>(link.in_doubt_seconds))
                             : std::chrono::system_clock::time_point::max();
      taken = AskOutcome(*stub, id, until, link.stopping);
      out->in_doubt_seconds = held.Seconds();
      if (link.on_in_doubt) link.on_in_doubt(false);
      if (taken.ok() && taken->has_value()) return sender.ConfirmCommitted(**taken);
      const std::string after =
          absl::StrFormat(" after %.1f s in doubt, the session held here", out->in_doubt_seconds);
      asked = taken.ok() ? "; asked" + after + ", it says it did not take the session"
                         : "; it could not be asked whether it took the session (" +
                               std::string(taken.status().message()) + ")," + after +
                               " and now served here again";
    } else {
      if (taken.ok() && taken->has_value()) return sender.ConfirmCommitted(**taken);
      asked = taken.ok() ? "; asked, it says it did not take the session"
                         : "; asking it whether it took the session failed (" +
                               std::string(taken.status().message()) + ")";
    }
  }
  sender.Abort();
  return absl::Status(st.ok() ? absl::StatusCode::kUnavailable : FromGrpc(st).code(),
                      "target did not confirm the hand-over" +
                          (st.ok() ? std::string() : ": " + st.error_message()) + asked);
}

}  // namespace riskkv
