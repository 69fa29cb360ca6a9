// A Generate call as a client of the node API makes it when sessions may migrate mid-stream:
// when the stream's last message says the session moved (GenerateReply.moved), the call goes on
// with the tokens left on the target, under the session's id there, and so on for every move.
// riskkvctl, the live hand-over bench and the tests use it; other clients do the same with the
// message documented in docs/services.md.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "riskkv/v1/node.grpc.pb.h"
#include "services/access/client_token.h"

namespace riskkv {

struct FollowOptions {
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      nullptr;                                 // for every node (null: plaintext)
  std::shared_ptr<TokenFile> token = nullptr;  // the caller's bearer token (or null)
  bool follow = true;                          // false: stop at the first move
  double deadline_seconds = 600;               // of each Generate call
};

struct FollowResult {
  grpc::Status status;  // the last call's
  int tokens = 0;
  int moves = 0;                         // moves followed
  std::optional<v1::SessionMoved> last;  // the last move seen (followed or not)
};

// Generates up to `max_tokens` in `session` on the node at `address`. `on_token` hears each
// token with the number of moves followed before it; `on_move` each move (may be null).
FollowResult GenerateFollowing(
    const std::string& address, std::string session, int max_tokens, const FollowOptions& options,
    const std::function<void(const v1::GenerateReply& token, int moves)>& on_token,
    const std::function<void(const v1::SessionMoved& moved)>& on_move = nullptr);

}  // namespace riskkv
