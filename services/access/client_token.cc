// Bearer tokens on outgoing calls (see client_token.h).
#include "services/access/client_token.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/access/watched_file.h"
#include "spdlog/spdlog.h"

namespace riskkv {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr int64_t kMaxTokenBytes = 4096;

class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::shared_ptr<TokenFile> token) : token_(std::move(token)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", "Bearer " + token_->Token()});
    }
    methods->Proceed();
  }

 private:
  std::shared_ptr<TokenFile> token_;
};

class TokenInterceptorFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<TokenFile> token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(token_);
  }

 private:
  std::shared_ptr<TokenFile> token_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<TokenFile>> TokenFile::Open(std::string path, std::string flag) {
  std::shared_ptr<TokenFile> f(new TokenFile(std::move(path), std::move(flag)));
  const std::string stamp = FileStamp(f->path_);
  auto token = f->Read();
  if (!token.ok()) return token.status();
  absl::MutexLock lock(&f->mu_);
  f->token_ = *std::move(token);
  f->stamp_ = stamp;
  f->checked_ = absl::Now();
  return f;
}

absl::StatusOr<std::string> TokenFile::Read() const {
  auto read = ReadBoundedFile(path_, kMaxTokenBytes);
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag_, ": ", read.status().message()));
  }
  const std::string& text = *read;
  std::string token(absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
  if (token.size() < kMinTokenLength || token.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag_, ": ", path_, " does not start with a token (one line of at least ",
        kMinTokenLength, " characters without spaces)"));
  }
  return token;
}

std::string TokenFile::Token() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < absl::Seconds(1)) return token_;
  checked_ = now;
  const std::string stamp = FileStamp(path_);
  if (stamp.empty() || stamp == stamp_) return token_;
  stamp_ = stamp;
  auto token = Read();
  if (!token.ok()) {
    spdlog::error("{}; the previous token stays", std::string(token.status().message()));
    return token_;
  }
  token_ = *std::move(token);
  return token_;
}

std::shared_ptr<grpc::Channel> OpenChannel(const std::string& address,
                                           const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                           std::shared_ptr<TokenFile> token,
                                           const grpc::ChannelArguments& args) {
  if (token == nullptr) return grpc::CreateCustomChannel(address, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<TokenInterceptorFactory>(std::move(token)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args,
                                                                 std::move(factories));
}

}  // namespace riskkv
