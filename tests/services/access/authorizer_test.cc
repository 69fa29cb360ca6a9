// The one authorisation check, without a transport: who a call is from its bearer token or its
// certificate's names, and whether its role may do what it asks; and where a server without
// credentials may listen.
#include "services/access/authorizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace riskkv {
namespace {

class AuthorizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("riskkv_authorizer_test." + std::to_string(::getpid())))
                .string();
    std::ofstream(path_) << "client alice token alice-secret-0123456789\n"
                            "node edge-b token edge-b-secret-0123456789\n"
                            "operator ops san ops.riskkv.internal\n";
    auto f = AccessFile::Open(path_);
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = std::shared_ptr<AccessFile>(*std::move(f));
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
  std::shared_ptr<AccessFile> file_;
};

TEST_F(AuthorizerTest, WithoutAnAccessFileEveryoneIsAnAnonymousOperator) {
  const Authorizer open;
  EXPECT_TRUE(open.open());
  for (Action a : {Action::kUseSessions, Action::kReceiveSessions, Action::kPutPolicies}) {
    auto who = open.Check("", {}, a);
    ASSERT_TRUE(who.ok());
    EXPECT_EQ(who->identity, "");
    EXPECT_TRUE(who->any_session());
  }
}

TEST_F(AuthorizerTest, ACallWithoutKnownCredentialsIsUnauthenticated) {
  const Authorizer a(file_);
  const struct {
    std::string header;
    std::vector<std::string> sans;
    const char* says;
  } cases[] = {
      {"", {}, "this server needs credentials"},
      {"Basic YWxpY2U6c2VjcmV0", {}, "not 'Bearer <token>'"},
      {"Bearer alice-secret-01234567", {}, "not in this server's access file"},
      {"", {"mallory.example", "x"}, "(mallory.example, ...) is in"},
  };
  for (const auto& c : cases) {
    auto who = a.Check(c.header, c.sans, Action::kUseSessions);
    ASSERT_FALSE(who.ok()) << c.header;
    EXPECT_EQ(who.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_NE(who.status().message().find(c.says), std::string::npos) << who.status();
  }
}

TEST_F(AuthorizerTest, EachRoleDoesWhatItMayAndIsToldWhatItMayNot) {
  const Authorizer a(file_);
  auto alice = a.Check("Bearer alice-secret-0123456789", {}, Action::kUseSessions);
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->identity, "alice");
  auto send_in = a.Check("Bearer alice-secret-0123456789", {}, Action::kReceiveSessions);
  ASSERT_FALSE(send_in.ok());
  EXPECT_EQ(send_in.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(send_in.status().message().find(
                "'alice' (role client) may not send sessions to this node: that needs the node "
                "or operator role"),
            std::string::npos)
      << send_in.status();
  auto put = a.Check("Bearer edge-b-secret-0123456789", {}, Action::kPutPolicies);
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(put.status().message().find("needs the operator role"), std::string::npos);
  auto node_sessions = a.Check("Bearer edge-b-secret-0123456789", {}, Action::kUseSessions);
  EXPECT_EQ(node_sessions.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(a.Check("Bearer edge-b-secret-0123456789", {}, Action::kReceiveSessions).ok());
  // A certificate name, the second of the peer's, for the operator.
  auto ops = a.Check("", {"spiffe://x", "ops.riskkv.internal"}, Action::kPutPolicies);
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->identity, "ops");
  EXPECT_TRUE(ops->any_session());
}

TEST(ListenExposure, WithoutCredentialsOnlyLoopbackUnlessInsecure) {
  Exposure e = ListenExposure("0.0.0.0:7070", /*mutual_tls=*/false, /*access_file=*/false, false);
  EXPECT_EQ(e.listen, "127.0.0.1:7070");
  EXPECT_NE(e.note.find("--insecure"), std::string::npos);
  EXPECT_EQ(ListenExposure("[::]:0", false, false, false).listen, "127.0.0.1:0");
  EXPECT_EQ(ListenExposure("127.0.0.1:7070", false, false, false).listen, "127.0.0.1:7070");
  EXPECT_TRUE(ListenExposure("localhost:7070", false, false, false).note.empty());
  EXPECT_EQ(ListenExposure("0.0.0.0:7070", false, false, /*insecure=*/true).listen, "0.0.0.0:7070");
  // Clients that must present a CA-signed certificate are known callers; an access file names
  // them. (TLS with a server certificate alone is the first case: anyone may connect.)
  EXPECT_EQ(ListenExposure("0.0.0.0:7070", /*mutual_tls=*/true, false, false).listen,
            "0.0.0.0:7070");
  EXPECT_NE(e.note.find("TLS with a server certificate alone"), std::string::npos);
  EXPECT_EQ(ListenExposure("0.0.0.0:7070", false, /*access_file=*/true, false).listen,
            "0.0.0.0:7070");
}

}  // namespace
}  // namespace riskkv
