// A Generate call that follows its session (see follow_generate.h).
#include "services/client/follow_generate.h"

#include <chrono>

namespace riskkv {

FollowResult GenerateFollowing(
    const std::string& address, std::string session, int max_tokens, const FollowOptions& options,
    const std::function<void(const v1::GenerateReply& token, int moves)>& on_token,
    const std::function<void(const v1::SessionMoved& moved)>& on_move) {
  FollowResult out;
  auto credentials = options.credentials ? options.credentials : grpc::InsecureChannelCredentials();
  std::string at = address;
  int remaining = max_tokens;
  while (true) {
    auto stub = v1::Node::NewStub(OpenChannel(at, credentials, options.token));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         std::chrono::duration<double>(options.deadline_seconds)));
    // The session is already on the target it moved to, so a target that cannot be reached for
    // a moment (a partition, a restarting proxy) is waited for until the deadline; the request
    // is sent only once a connection is up, so no token is generated twice.
    if (out.moves > 0) ctx.set_wait_for_ready(true);
    v1::GenerateRequest req;
    req.set_session_id(session);
    req.set_max_tokens(remaining);
    auto reader = stub->Generate(&ctx, req);
    std::optional<v1::SessionMoved> moved;
    v1::GenerateReply r;
    while (reader->Read(&r)) {
      if (r.has_moved()) {
        moved = r.moved();
        continue;
      }
      ++out.tokens;
      if (on_token) on_token(r, out.moves);
    }
    out.status = reader->Finish();
    if (!out.status.ok() || !moved) return out;
    out.last = moved;
    if (on_move) on_move(*moved);
    if (!options.follow || moved->remaining_tokens() <= 0) return out;
    ++out.moves;
    at = moved->target_address();
    session = moved->session_id();
    remaining = moved->remaining_tokens();
  }
}

}  // namespace riskkv
