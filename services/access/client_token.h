// The client side of access files: the bearer token a process presents (riskkvctl's
// --token-file, a node's --peer-token-file towards other nodes and the control plane), and
// channels whose every call carries it.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace riskkv {

// A token from the first line of a file, read again when the file changes (checked at most once
// a second), so it can be rotated without a restart.
class TokenFile {
 public:
  // The file must hold a token now: one line of at least 16 characters, no spaces. The flag
  // named in errors is `flag`.
  static absl::StatusOr<std::shared_ptr<TokenFile>> Open(std::string path, std::string flag);
  // The token in force; a file that changed into something unreadable or malformed is logged
  // and the previous token kept.
  std::string Token() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  TokenFile(std::string path, std::string flag) : path_(std::move(path)), flag_(std::move(flag)) {}
  absl::StatusOr<std::string> Read() const;

  const std::string path_;
  const std::string flag_;
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

// A channel to `address`; with a token, every call on it sends `authorization: Bearer <token>`.
std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                           const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                           std::shared_ptr<TokenFile> token,
                                           const grpc::ChannelArguments& args = {});

}  // namespace riskkv
