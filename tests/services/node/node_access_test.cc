// Who may touch a session, on nodes with an access file: no call without credentials, a
// session is its owner's alone (and an operator's), only nodes send sessions in, and a migrated
// session keeps its owner. In one process over real gRPC, with the tiny model.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "services/access/client_token.h"
#include "tests/services/node/node_fixture.h"

namespace riskkv {
namespace {

class NodeAccess : public Nodes {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("riskkv_node_access_test." + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    const std::map<std::string, std::string> secrets = {{"alice", "alice-secret-0123456789"},
                                                        {"bob", "bob-secret-0123456789"},
                                                        {"edge", "edge-secret-0123456789"},
                                                        {"ops", "ops-secret-0123456789"}};
    std::ofstream((dir_ / "access").string())
        << "client alice token " << secrets.at("alice") << "\nclient bob token "
        << secrets.at("bob") << "\nnode edge token " << secrets.at("edge")
        << "\noperator ops token " << secrets.at("ops") << "\n";
    for (const auto& [who, secret] : secrets) {
      std::ofstream((dir_ / who).string()) << secret << "\n";
      auto t = TokenFile::Open((dir_ / who).string(), "token-file");
      ASSERT_TRUE(t.ok()) << t.status();
      tokens_[who] = *t;
    }
    auto f = AccessFile::Open((dir_ / "access").string());
    ASSERT_TRUE(f.ok()) << f.status();
    access_ = std::shared_ptr<AccessFile>(*std::move(f));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A node checking the access file; it presents the node token to targets unless told not to.
  std::unique_ptr<TestNode> StartGuarded(bool peer_token = true,
                                         const std::function<void(NodeOptions&)>& tweak = nullptr,
                                         double link_mbps = 0) {
    return Start(/*with_policy=*/false, link_mbps, 3e-3, [&](NodeOptions& o) {
      o.access_file = access_;
      if (peer_token) o.peer_token = tokens_.at("edge");
      if (tweak) tweak(o);
    });
  }
  // A stub of `n` presenting `who`'s token ("" for none).
  std::unique_ptr<v1::Node::Stub> As(const TestNode& n, const std::string& who) {
    return v1::Node::NewStub(OpenChannel(n.address, grpc::InsecureChannelCredentials(),
                                         who.empty() ? nullptr : tokens_.at(who)));
  }
  static grpc::Status Get(v1::Node::Stub& stub, const std::string& id, v1::SessionInfo* info) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    req.set_with_tokens(true);
    return stub.GetSession(&ctx, req, info);
  }
  static std::vector<std::string> List(v1::Node::Stub& stub) {
    grpc::ClientContext ctx;
    v1::ListSessionsReply reply;
    EXPECT_TRUE(stub.ListSessions(&ctx, {}, &reply).ok());
    std::vector<std::string> ids;
    for (const auto& s : reply.sessions()) ids.push_back(s.session_id());
    return ids;
  }

  std::filesystem::path dir_;
  std::map<std::string, std::shared_ptr<TokenFile>> tokens_;
  std::shared_ptr<AccessFile> access_;
};

TEST_F(NodeAccess, CallsWithoutKnownCredentialsAreRefusedAndCounted) {
  auto a = StartGuarded();
  for (const std::string& who : {std::string(), std::string("mallory")}) {
    std::unique_ptr<v1::Node::Stub> stub;
    if (who.empty()) {
      stub = As(*a, "");
    } else {
      std::ofstream((dir_ / who).string()) << "mallory-guessed-0123456789\n";
      stub = v1::Node::NewStub(OpenChannel(a->address, grpc::InsecureChannelCredentials(),
                                           *TokenFile::Open((dir_ / who).string(), "token-file")));
    }
    grpc::ClientContext ctx;
    v1::StartSessionRequest req;
    req.add_token_ids(5);
    v1::SessionInfo info;
    const grpc::Status s = stub->StartSession(&ctx, req, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << who;
    grpc::ClientContext lc;
    v1::ListSessionsReply listed;
    EXPECT_EQ(stub->ListSessions(&lc, {}, &listed).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(
      a->MetricValue(R"(riskkv_requests_denied_total{model="tiny",reason="unauthenticated"})"), 4);
}

TEST_F(NodeAccess, ASessionIsItsOwnersAndAnOperatorsOnly) {
  auto a = StartGuarded();
  a->stub = As(*a, "alice");
  const std::string id = StartSession(*a);
  ASSERT_FALSE(id.empty());
  auto bob = As(*a, "bob");
  // To bob the session does not exist: every call says what it says of an unknown id.
  v1::SessionInfo info;
  const grpc::Status got = Get(*bob, id, &info);
  EXPECT_EQ(got.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(got.error_message(), "no session '" + id + "' on this node");
  {
    grpc::ClientContext ctx;
    v1::GenerateRequest req;
    req.set_session_id(id);
    req.set_max_tokens(2);
    auto reader = bob->Generate(&ctx, req);
    v1::GenerateReply r;
    EXPECT_FALSE(reader->Read(&r));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::ScoreRequest req;
    req.set_session_id(id);
    req.add_token_ids(7);
    v1::ScoreReply reply;
    EXPECT_EQ(bob->Score(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::MigrateRequest req;
    req.set_session_id(id);
    req.set_target_address("127.0.0.1:1");
    req.set_mode(v1::FULL_KV);
    v1::MigrateReply reply;
    EXPECT_EQ(bob->Migrate(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest req;
    req.set_session_id(id);
    v1::CloseSessionReply reply;
    EXPECT_EQ(bob->CloseSession(&ctx, req, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_TRUE(List(*bob).empty()) << "bob lists only his own sessions";
  EXPECT_EQ(List(*a->stub), std::vector<std::string>{id});
  auto ops = As(*a, "ops");
  EXPECT_EQ(List(*ops), std::vector<std::string>{id}) << "an operator lists every session";
  ASSERT_TRUE(Get(*ops, id, &info).ok());
  // The session survived bob's attempts whole, and is alice's to use.
  auto more = Generate(*a, id, 3);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->size(), 3u);
  // A node identity has no sessions of its own to use.
  auto edge = As(*a, "edge");
  EXPECT_EQ(Get(*edge, id, &info).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(NodeAccess, OnlyNodesSendSessionsIn) {
  auto b = StartGuarded();
  for (const std::string& who : {std::string("alice"), std::string("")}) {
    auto stub = As(*b, who);
    grpc::ClientContext ctx;
    auto stream = stub->Receive(&ctx);
    v1::MigrationFrame f;
    f.mutable_handshake()->set_protocol_version(1);
    stream->Write(f);
    stream->WritesDone();
    v1::ReceiveReply r;
    EXPECT_FALSE(stream->Read(&r)) << "no reply to a caller that may not send sessions in";
    const grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(),
              who.empty() ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::PERMISSION_DENIED)
        << s.error_message();
    grpc::ClientContext oc;
    v1::MigrationOutcomeRequest oreq;
    oreq.set_migration_id("00ff");
    v1::MigrationOutcomeReply oreply;
    EXPECT_EQ(stub->MigrationOutcome(&oc, oreq, &oreply).error_code(), s.error_code());
  }
  EXPECT_TRUE(List(*As(*b, "ops")).empty());
}

TEST_F(NodeAccess, AMigratedSessionKeepsItsOwner) {
  auto a = StartGuarded();
  auto b = StartGuarded();
  a->stub = As(*a, "alice");
  b->stub = As(*b, "alice");
  const std::string id = StartSession(*a);
  ASSERT_TRUE(Generate(*a, id, 2).ok());
  const std::vector<int32_t> before = Tokens(*a, id);
  v1::MigrateReply reply;
  const grpc::Status s = Migrate(*a, id, *b, v1::FULL_KV, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string moved = reply.target_session_id();
  EXPECT_EQ(Tokens(*b, moved), before);
  EXPECT_EQ(List(*b->stub), std::vector<std::string>{moved});
  v1::SessionInfo info;
  EXPECT_EQ(Get(*As(*b, "bob"), moved, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(List(*As(*b, "bob")).empty());
  // On the source, only its owner learns where it went.
  v1::SessionMoved to;
  auto none = Generate(*a, id, 1, &to);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(to.session_id(), moved);
  const grpc::Status asked = Get(*As(*a, "bob"), id, &info);
  EXPECT_EQ(asked.error_message(), "no session '" + id + "' on this node");
  auto on = Generate(*b, moved, 2);
  ASSERT_TRUE(on.ok()) << on.status();
}

TEST_F(NodeAccess, ASourceWithoutANodeTokenIsRefusedAndKeepsTheSession) {
  auto a = StartGuarded(/*peer_token=*/false);
  auto b = StartGuarded();
  a->stub = As(*a, "alice");
  const std::string id = StartSession(*a);
  v1::MigrateReply reply;
  const grpc::Status s = Migrate(*a, id, *b, v1::FULL_KV, &reply);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("credentials"), std::string::npos) << s.error_message();
  v1::SessionInfo info;
  EXPECT_TRUE(Get(*a->stub, id, &info).ok()) << "the session stays on its source";
  EXPECT_TRUE(List(*As(*b, "ops")).empty()) << "nothing was registered on the target";
  EXPECT_TRUE(Generate(*a, id, 2).ok());
}

// Per-identity quotas: alice's sessions and her migrations in flight are bounded on their own,
// so one client cannot take the table or the link from the others.
TEST_F(NodeAccess, OneIdentityHoldsAtMostItsQuota) {
  auto a = StartGuarded(
      true,
      [](NodeOptions& o) {
        o.max_sessions_per_identity = 2;
        o.max_migrations_per_identity = 1;
      },
      /*link_mbps=*/0);
  auto b = StartGuarded();
  a->stub = As(*a, "alice");
  const std::string s1 = StartSession(*a), s2 = StartSession(*a);
  ASSERT_FALSE(s1.empty());
  ASSERT_FALSE(s2.empty());
  {
    grpc::ClientContext ctx;
    v1::StartSessionRequest req;
    req.add_token_ids(5);
    v1::SessionInfo info;
    const grpc::Status s = a->stub->StartSession(&ctx, req, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(s.error_message().find("'alice' holds its limit of 2 sessions"), std::string::npos)
        << s.error_message();
  }
  auto bob = As(*a, "bob");
  {
    grpc::ClientContext ctx;
    v1::StartSessionRequest req;
    req.add_token_ids(5);
    v1::SessionInfo info;
    EXPECT_TRUE(bob->StartSession(&ctx, req, &info).ok()) << "bob has his own quota";
  }
  auto ops = As(*a, "ops");
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    v1::StartSessionRequest req;
    req.add_token_ids(5);
    v1::SessionInfo info;
    EXPECT_TRUE(ops->StartSession(&ctx, req, &info).ok()) << "an operator is held to no quota";
  }
  // One migration of alice's is in flight (to a listener that never answers, until its 3 s
  // deadline); her second is refused meanwhile.
  const int silent = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(silent, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(silent, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(silent, 4), 0);
  ASSERT_EQ(::getsockname(silent, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string nowhere = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  std::thread first([&] {
    v1::MigrateReply reply;
    const grpc::Status s = Migrate(*a, s1, *b, v1::FULL_KV, &reply, false, nowhere, 3);
    EXPECT_FALSE(s.ok()) << "nobody answers there";
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  v1::MigrateReply reply;
  const grpc::Status second = Migrate(*a, s2, *b, v1::FULL_KV, &reply);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_NE(second.error_message().find("'alice' has its limit of 1 migrations in flight"),
            std::string::npos)
      << second.error_message();
  first.join();
  v1::SessionInfo info;
  EXPECT_TRUE(Get(*a->stub, s2, &info).ok()) << "the refused migration left the session here";
  const grpc::Status again = Migrate(*a, s2, *b, v1::FULL_KV, &reply);
  EXPECT_TRUE(again.ok()) << "the quota is free again: " << again.error_message();
  ::close(silent);
}

}  // namespace
}  // namespace riskkv
