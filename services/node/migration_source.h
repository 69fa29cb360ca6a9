// The source role's transport: a MigrationSender carried over the target's Receive stream, with
// the caller's cancellation honoured between frames (the sender's `pace` applies the node's link
// limit to every chunk).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "services/access/client_token.h"
#include "services/migration/migration_sender.h"

namespace riskkv {

struct SourceLink {
  std::string target;                                     // the target node's address
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  std::shared_ptr<TokenFile> token;  // this node's bearer token for the target (may be null)
  std::chrono::system_clock::time_point deadline;
  std::function<bool()> cancelled;  // the caller gave up (may be null)
  // After a commit whose confirmation was lost, when the target cannot be asked whether it took
  // the session before `deadline`: the session stays withdrawn (served by neither node for
  // sure, so never by both) and the target is asked on, past the deadline, for at most
  // `in_doubt_seconds` (0: until it answers) or until `stopping` says the node is shutting down.
  // `on_in_doubt` (may be null) is called when that hold begins and when it ends.
  double in_doubt_seconds = 0;
  std::function<bool()> stopping;
  std::function<void(bool begins)> on_in_doubt;
};

struct SendOutcome {
  bool refused = false;         // the target turned the handshake down: nothing moved
  bool resumed = false;         // the target resumed the session (the KV crossed)
  double send_seconds = 0;      // first chunk to trailer written (stop-and-copy: the wire alone)
  double transfer_seconds = 0;  // first chunk to the target's `resumed`
  double in_doubt_seconds = 0;  // how long the outcome of the commit was unknown past the deadline
};

// Called when the target acknowledged a live migration's pre-copy round: moves the sender on
// (MigrationSender::NextRound or Pause). Its error ends the migration with that status.
using BetweenRounds = std::function<absl::Status(MigrationSender& sender)>;

// Runs `sender` until the target committed (OK) or the migration failed; on failure the sender
// has put a withdrawn session back. The target's own status (it may have closed the stream with
// a precise reason) wins over this side's. A live sender needs `between_rounds`.
absl::Status RunMigration(MigrationSender& sender, const SourceLink& link, SendOutcome* outcome,
                          const BetweenRounds& between_rounds = nullptr);

}  // namespace riskkv
