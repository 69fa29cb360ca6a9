// Tokens a client presents: read from a file, refused when malformed, rotated without a
// restart, and sent on every call of a channel as `authorization: Bearer <token>` (checked
// against a real gRPC server).
#include "services/access/client_token.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"

namespace riskkv {
namespace {

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("riskkv_client_token_test." + std::to_string(::getpid())))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void Write(const std::string& text) {
    std::ofstream(path_ + ".tmp") << text;
    std::filesystem::rename(path_ + ".tmp", path_);
  }
  std::string path_;
};

TEST_F(TokenFileTest, AFileMustStartWithAToken) {
  auto missing = TokenFile::Open(path_, "token-file");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("--token-file: cannot read"), std::string::npos);
  for (const char* bad : {"", "short\n", "two words here 0123456789\n", "\n0123456789abcdef\n"}) {
    Write(bad);
    auto t = TokenFile::Open(path_, "token-file");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("does not start with a token"), std::string::npos);
  }
  Write(std::string(5000, 'a'));
  EXPECT_FALSE(TokenFile::Open(path_, "token-file").ok());
  Write("  0123456789abcdef  \nignored\n");
  auto ok = TokenFile::Open(path_, "token-file");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->Token(), "0123456789abcdef");
}

TEST_F(TokenFileTest, ARotatedTokenIsUsedAfterAtMostASecondAndABrokenOneIgnored) {
  Write("first-token-0123456789\n");
  auto t = TokenFile::Open(path_, "token-file");
  ASSERT_TRUE(t.ok());
  Write("second-token-0123456789\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ((*t)->Token(), "second-token-0123456789");
  Write("bad\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ((*t)->Token(), "second-token-0123456789");
}

// A health service that records the authorization header of each call.
class RecordingHealth final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext* ctx, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* reply) override {
    auto it = ctx->client_metadata().find("authorization");
    seen = it == ctx->client_metadata().end() ? "(none)"
                                              : std::string(it->second.data(), it->second.size());
    reply->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }
  std::string seen;
};

TEST_F(TokenFileTest, EveryCallOfAChannelCarriesTheToken) {
  RecordingHealth health;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&health);
  auto server = b.BuildAndStart();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  Write("the-token-0123456789\n");
  auto t = TokenFile::Open(path_, "token-file");
  ASSERT_TRUE(t.ok());
  for (bool with_token : {true, false}) {
    auto stub = grpc::health::v1::Health::NewStub(
        OpenChannel(address, grpc::InsecureChannelCredentials(), with_token ? *t : nullptr));
    for (int i = 0; i < 2; ++i) {
      grpc::ClientContext ctx;
      grpc::health::v1::HealthCheckResponse reply;
      ASSERT_TRUE(stub->Check(&ctx, {}, &reply).ok());
      EXPECT_EQ(health.seen, with_token ? "Bearer the-token-0123456789" : "(none)");
    }
  }
  server->Shutdown();
}

}  // namespace
}  // namespace riskkv
