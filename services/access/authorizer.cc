// Authentication and authorisation of one call (see authorizer.h).
#include "services/access/authorizer.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace riskkv {

absl::StatusOr<Principal> Authorizer::Check(absl::string_view authorization,
                                            const std::vector<std::string>& sans,
                                            Action action) const {
  if (file_ == nullptr) return Principal{};
  const std::shared_ptr<const AccessList> list = file_->Current();
  std::optional<Principal> who;
  if (!authorization.empty()) {
    absl::string_view token = authorization;
    if (!absl::ConsumePrefix(&token, "Bearer ")) {
      return absl::UnauthenticatedError(
          "the authorization header is not 'Bearer <token>'; nothing was done");
    }
    who = list->ByToken(token);
    if (!who) {
      return absl::UnauthenticatedError(
          "the bearer token is not in this server's access file; nothing was done");
    }
  } else {
    for (const std::string& san : sans) {
      if ((who = list->BySan(san))) break;
    }
    if (!who) {
      return absl::UnauthenticatedError(
          sans.empty()
              ? "this server needs credentials: a bearer token (authorization: Bearer "
                "<token>) or a client certificate named in its access file"
              : absl::StrCat("no name of the client certificate (", sans.front(),
                             sans.size() > 1 ? ", ..." : "", ") is in this server's access file"));
    }
  }
  if (!Allows(who->role, action)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "'", who->identity, "' (role ", RoleName(who->role), ") may not ", ActionName(action),
        action == Action::kPutPolicies   ? ": that needs the operator role"
        : action == Action::kUseSessions ? ": that needs the client or operator role"
                                         : ": that needs the node or operator role"));
  }
  return *who;
}

absl::StatusOr<Principal> Authorizer::Check(const grpc::ServerContext& ctx, Action action) const {
  if (file_ == nullptr) return Principal{};
  std::string authorization;
  const auto& md = ctx.client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    authorization.assign(it->second.data(), it->second.size());
  }
  std::vector<std::string> sans;
  if (const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
      auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& v : auth->FindPropertyValues("x509_subject_alternative_name")) {
      sans.emplace_back(v.data(), v.size());
    }
  }
  return Check(authorization, sans, action);
}

bool Authorizer::Limited(const std::string& identity) const {
  if (file_ == nullptr || identity.empty()) return false;
  return file_->Current()->RoleOf(identity) != Role::kOperator;
}

Exposure ListenExposure(const std::string& listen, bool mutual_tls, bool access_file,
                        bool insecure) {
  if (mutual_tls || access_file || insecure) return {listen, ""};
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  if (host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1") {
    return {listen, ""};
  }
  const std::string bound = "127.0.0.1:" + port;
  return {bound, absl::StrCat("no caller credentials (--access-file, or mutual TLS with --tls-ca): "
                              "listening on ",
                              bound, " only instead of ", listen,
                              " (TLS with a server certificate alone encrypts but lets anyone "
                              "in); give credentials, or --insecure to serve anyone who reaches ",
                              listen)};
}

}  // namespace riskkv
