// Who may call riskkv's servers and as what: an access file maps credentials to identities, each
// with one role, as a Kubernetes static token file does.
//
//   # role      identity   credential
//   client      alice      token  3f1c0b5e9d2a4c7e8b6f0a1d2c3e4f5a
//   node        edge-b     token  9a8b7c6d5e4f30211f2e3d4c5b6a7988
//   operator    ops        san    ops.riskkv.internal
//
// `token` is a bearer secret the caller sends as `authorization: Bearer <token>`; `san` names a
// subject alternative name of a client certificate (mutual TLS) that the server's CA signed.
// Roles:
//   client    its own sessions: start, generate, score, inspect, list, close, migrate them
//   node      a peer node: send sessions in (Receive, MigrationOutcome), follow the control
//             plane's policies (Watch, GetBank)
//   operator  everything: any session, and PutPolicy
// Every role may read policies (GetPolicy, ListPolicies).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace riskkv {

enum class Role : uint8_t { kClient, kNode, kOperator };

// An identity as access files name them: 1-128 characters of [A-Za-z0-9._@-].
bool ValidIdentity(absl::string_view identity);
absl::string_view RoleName(Role role);

// What a call does; each is allowed to some roles (Allows).
enum class Action : uint8_t {
  kUseSessions,      // StartSession, Generate, GetSession, ListSessions, CloseSession, Score,
                     // Migrate
  kReceiveSessions,  // Receive, MigrationOutcome
  kFollowPolicies,   // Watch, GetBank
  kReadPolicies,     // GetPolicy, ListPolicies
  kPutPolicies,      // PutPolicy
};
absl::string_view ActionName(Action action);
bool Allows(Role role, Action action);

// A caller as the server knows it. A server without an access file serves everyone as an
// anonymous operator (identity ""), which it allows on loopback only unless told --insecure.
struct Principal {
  std::string identity;
  Role role = Role::kOperator;
  // Any session, whoever owns it.
  bool any_session() const { return role == Role::kOperator; }
};

class AccessList {
 public:
  // The file's text; `source` names it in errors. InvalidArgument naming the line for an unknown
  // role or credential kind, a malformed identity (1-128 of [A-Za-z0-9._@-]), a token shorter
  // than 16 characters, a credential listed twice, or one identity under two roles.
  static absl::StatusOr<AccessList> Parse(absl::string_view text, absl::string_view source);

  // The principal a bearer token or a certificate name belongs to. Tokens are compared in time
  // that does not depend on where they differ.
  std::optional<Principal> ByToken(absl::string_view token) const;
  std::optional<Principal> BySan(absl::string_view san) const;
  // The role of an identity the file names.
  std::optional<Role> RoleOf(absl::string_view identity) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Principal who;
    bool is_token = false;
    std::string credential;
  };
  std::vector<Entry> entries_;
};

}  // namespace riskkv
