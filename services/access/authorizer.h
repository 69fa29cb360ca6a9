// The one place a server decides who calls and whether it may: every RPC handler of the node and
// the control plane asks Check with the action it performs, before anything else.
//
// With an access file, a caller is known by its bearer token (`authorization: Bearer <token>`)
// or, under mutual TLS, by its certificate's subject alternative names; an unknown caller is
// Unauthenticated and a known one without the role PermissionDenied, both naming why. Without
// one, every caller is an anonymous operator: the servers then listen on loopback only unless
// started with --insecure (Exposure).
#pragma once

#include <grpcpp/server_context.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/access/access_file.h"
#include "services/access/access_list.h"

namespace riskkv {

class Authorizer {
 public:
  // `file` may be null: every caller an anonymous operator.
  explicit Authorizer(std::shared_ptr<AccessFile> file = nullptr) : file_(std::move(file)) {}

  bool open() const { return file_ == nullptr; }
  // Whether the identity that owns a session is held to per-identity quotas: every identity
  // but an operator (and nobody on a server without an access file).
  bool Limited(const std::string& identity) const;

  // Transport-free: the call's `authorization` metadata ("" if none) and its peer's certificate
  // names.
  absl::StatusOr<Principal> Check(absl::string_view authorization,
                                  const std::vector<std::string>& sans, Action action) const;
  // The same from a gRPC call.
  absl::StatusOr<Principal> Check(const grpc::ServerContext& ctx, Action action) const;

 private:
  std::shared_ptr<AccessFile> file_;
};

// Where a server that cannot tell its callers apart may listen. `listen` is HOST:PORT; with
// neither mutual TLS (clients must present a certificate the CA signed) nor an access file, and
// without `insecure`, a host other than loopback is replaced by 127.0.0.1 and the returned note
// (for the log) says so; otherwise `listen` is returned as given. TLS with a server certificate
// alone does not count: it encrypts, but anyone may connect, and without an access file anyone
// may do anything.
struct Exposure {
  std::string listen;
  std::string note;  // "" when nothing changed
};
Exposure ListenExposure(const std::string& listen, bool mutual_tls, bool access_file,
                        bool insecure);

}  // namespace riskkv
