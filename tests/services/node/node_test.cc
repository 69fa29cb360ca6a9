// Edge nodes over real gRPC on 127.0.0.1 ephemeral ports, in one process: sessions, migrations
// in every mode, fallbacks, failures that leave the session on the source, chains, concurrency
// and the metrics they move.
#include <gtest/gtest.h>
#include <prometheus/text_serializer.h>

#include <atomic>
#include <functional>
#include <future>
#include <regex>
#include <thread>

#include "common/engine/cpu_engine.h"
#include "common/model/model_fingerprint.h"
#include "common/model/top_logprobs.h"
#include "services/grpc_status.h"
#include "services/migration/wire.h"
#include "services/node/node_service.h"
#include "tests/services/node/node_fixture.h"
#include "tests/services/tiny_policy.h"
#include "tests/test_paths.h"

namespace riskkv {
namespace {

TEST_F(Nodes, EveryModeResumesAndTheMetricsMove) {
  auto a = Start(true), b = Start(true);
  for (auto mode : {v1::FULL_KV, v1::TOKEN_REPLAY, v1::RECONSTRUCT}) {
    SCOPED_TRACE(v1::MigrationMode_Name(mode));
    // The same session twice on A: one stays, one moves after 5 generated tokens.
    const std::string stay = StartSession(*a), move = StartSession(*a);
    ASSERT_TRUE(Generate(*a, stay, 5).ok());
    ASSERT_TRUE(Generate(*a, move, 5).ok());
    std::vector<int32_t> x;  // a continuation both sessions are scored on
    for (int i = 0; i < 16; ++i) x.push_back((i * 97 + 13) % 500);
    const double ref = Score(*a, stay, x);
    v1::MigrateReply reply;
    const grpc::Status s = Migrate(*a, move, *b, mode, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.mode(), mode);
    const double moved_nll = Score(*b, reply.target_session_id(), x);
    if (mode == v1::FULL_KV) {
      EXPECT_EQ(moved_nll, ref);
    }
    if (mode == v1::TOKEN_REPLAY) {
      EXPECT_EQ(moved_nll, ref);  // the engine is batch-invariant: a replay is the same forward
    }
    if (mode == v1::RECONSTRUCT) {
      // Rebuilt layers are close, not exact. This random-weight model's groups were fitted on
      // 4 short requests, so the bound is loose: within 10% of the exact NLL.
      std::fprintf(stderr, "RECONSTRUCT continuation NLL %.5f vs %.5f exact\n", moved_nll, ref);
      EXPECT_NE(moved_nll, ref);
      EXPECT_LT(std::abs(moved_nll - ref), 0.1 * ref);
    }
    EXPECT_FALSE(reply.target_session_id().empty());
    EXPECT_GT(reply.recovery_seconds(), 0.0);
    // Gone from A, on B with the same history; a Generate on A says where it went.
    v1::SessionMoved moved;
    auto gone = Generate(*a, move, 1, &moved);
    ASSERT_TRUE(gone.ok()) << gone.status();
    EXPECT_TRUE(gone->empty());
    EXPECT_EQ(moved.session_id(), reply.target_session_id());
    EXPECT_EQ(moved.target_address(), b->address);
    EXPECT_EQ(moved.remaining_tokens(), 1);
    EXPECT_EQ(Tokens(*b, reply.target_session_id()), Tokens(*a, stay));
    auto after = Generate(*b, reply.target_session_id(), 12);
    auto expect = Generate(*a, stay, 12);
    ASSERT_TRUE(after.ok() && expect.ok());
    std::vector<int32_t> moved_tail = Tokens(*b, reply.target_session_id());
    std::vector<int32_t> stay_tail = Tokens(*a, stay);
    if (mode == v1::RECONSTRUCT) {
      EXPECT_EQ(reply.kv_bytes_sent(), reply.kv_bytes_omitted());  // 4 of 8 layers
      EXPECT_GT(reply.rebuild_seconds(), 0.0);
    } else {
      EXPECT_EQ(moved_tail, stay_tail);  // greedy: token-identical to never migrating
    }
    if (mode == v1::TOKEN_REPLAY) {
      EXPECT_EQ(reply.kv_bytes_sent(), 0);
    }
  }
  const std::string ma = a->Metrics(), mb = b->Metrics();
  for (const char* mode : {"full_kv", "token_replay", "reconstruct"}) {
    EXPECT_NE(ma.find(std::string("mode=\"") + mode +
                      "\",model=\"tiny\",outcome=\"ok\",role=\"source\"} 1"),
              std::string::npos)
        << ma;
    EXPECT_NE(mb.find(std::string("mode=\"") + mode +
                      "\",model=\"tiny\",outcome=\"ok\",role=\"target\"} 1"),
              std::string::npos)
        << mb;
  }
  EXPECT_NE(mb.find("riskkv_recovery_seconds_count"), std::string::npos);
  EXPECT_GT(a->MetricValue("riskkv_kv_omitted_bytes_total{model=\"tiny\"}"), 0)
      << "RECONSTRUCT omitted nothing: " << ma;
  EXPECT_TRUE(std::regex_search(mb, std::regex("riskkv_active_sessions\\{model=\"tiny\"\\} 3")))
      << mb;
}

// On SmolLM2 in both arithmetics (int8 activations is what nodes serve with by default), a
// FULL_KV or TOKEN_REPLAY migration reproduces the source bit for bit: a session prefilled in
// one batch and grown by decode steps scores a continuation with exactly the NLL of its copy
// that never moved, per token, and keeps generating the same tokens.
TEST_F(Nodes, FullKvAndTokenReplayAreExactOnSmolLM2) {
  const std::string path = testing::DefaultModelPath().string();
  auto probe = Model::Load(path, {.threads = 1});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const std::string fingerprint = *ModelFingerprint(**probe);
  std::vector<int32_t> history, continuation;
  for (int i = 0; i < 120; ++i) history.push_back((i * 7919 + 17) % 49152);
  for (int i = 0; i < 32; ++i) continuation.push_back((i * 104729 + 3) % 49152);
  for (auto activations : {ActivationPrecision::kInt8, ActivationPrecision::kF32}) {
    auto a = StartOn(path, activations, fingerprint, false, 0, 3e-3,
                     [](NodeOptions& o) { o.capacity = 512; });
    auto b = StartOn(path, activations, fingerprint, false, 0, 3e-3,
                     [](NodeOptions& o) { o.capacity = 512; });
    for (auto mode : {v1::FULL_KV, v1::TOKEN_REPLAY}) {
      SCOPED_TRACE(std::string(v1::MigrationMode_Name(mode)) +
                   (activations == ActivationPrecision::kInt8 ? " int8" : " f32"));
      const std::string stay = StartSession(*a, 0, history), move = StartSession(*a, 0, history);
      ASSERT_TRUE(Generate(*a, stay, 6).ok());
      ASSERT_TRUE(Generate(*a, move, 6).ok());
      const double before = Score(*a, stay, continuation);
      v1::MigrateReply reply;
      // The f32 replay of the real model is slow: a generous deadline.
      const grpc::Status s = Migrate(*a, move, *b, mode, &reply, false, "", 600);
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(Score(*b, reply.target_session_id(), continuation), before);
      auto moved = Generate(*b, reply.target_session_id(), 8);
      auto stayed = Generate(*a, stay, 8);
      ASSERT_TRUE(moved.ok() && stayed.ok());
      EXPECT_EQ(*moved, *stayed);
    }
  }
}

// Many users on one node: their Generate streams, a scoring and a long prompt arriving among
// them share the engine's steps, and each gets exactly what it gets alone on an idle node.
TEST_F(Nodes, ConcurrentCallsShareStepsAndGetWhatEachGetsAlone) {
  auto busy = Start(false);
  auto idle = Start(false);
  constexpr int kStreams = 6, kTokens = 12;
  auto prompt = [](int i, int n) {
    std::vector<int32_t> t;
    for (int j = 0; j < n; ++j) t.push_back((j * 31 + 7 * i + 5) % 500);
    return t;
  };
  // Alone, one call at a time.
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < kStreams; ++i) {
    alone.push_back(*Generate(*idle, StartSession(*idle, 0, prompt(i, 20 + i)), kTokens));
  }
  const std::vector<int32_t> scored = prompt(99, 40);
  const double nll_alone = Score(*idle, StartSession(*idle, 0, prompt(50, 30)), scored);
  const std::string long_alone = StartSession(*idle, 0, prompt(60, 170));
  // Together.
  std::vector<std::string> ids;
  for (int i = 0; i < kStreams; ++i) ids.push_back(StartSession(*busy, 0, prompt(i, 20 + i)));
  const std::string scoring = StartSession(*busy, 0, prompt(50, 30));
  const double before = busy->MetricValue("riskkv_batch_items_count{model=\"tiny\"}");
  const double items_before = busy->MetricValue("riskkv_batch_items_sum{model=\"tiny\"}");
  std::vector<absl::StatusOr<std::vector<int32_t>>> got(kStreams);
  std::vector<std::thread> calls;
  calls.reserve(kStreams + 2);
  for (int i = 0; i < kStreams; ++i) {
    calls.emplace_back([&, i] { got[i] = Generate(*busy, ids[i], kTokens); });
  }
  double nll_busy = 0;
  std::string long_busy;
  calls.emplace_back([&] { nll_busy = Score(*busy, scoring, scored); });
  calls.emplace_back([&] { long_busy = StartSession(*busy, 0, prompt(60, 170)); });
  for (auto& t : calls) t.join();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], alone[i]) << "stream " << i;
  }
  EXPECT_EQ(nll_busy, nll_alone);
  EXPECT_EQ(*Generate(*busy, long_busy, 4), *Generate(*idle, long_alone, 4));
  // Fewer steps than items: some steps ran several sessions.
  const std::string m = busy->Metrics();
  const double steps = busy->MetricValue("riskkv_batch_items_count{model=\"tiny\"}") - before;
  const double items = busy->MetricValue("riskkv_batch_items_sum{model=\"tiny\"}") - items_before;
  // Alone, the streams' decodes would take 6 x 11 steps and the prompt and scoring some more.
  EXPECT_GT(steps, 0);
  EXPECT_LE(steps, kStreams * (kTokens - 1) / 2) << m;
  EXPECT_GE(items / steps, 2) << m;
  EXPECT_EQ(busy->MetricValue("riskkv_generated_tokens_total{model=\"tiny\"}"),
            kStreams * kTokens + 4);
  EXPECT_EQ(busy->MetricValue("riskkv_time_to_first_token_seconds_count{model=\"tiny\"}"),
            kStreams + 1);
  EXPECT_EQ(busy->MetricValue("riskkv_inter_token_latency_seconds_count{model=\"tiny\"}"),
            kStreams * (kTokens - 1) + 3);
  for (const char* kind : {"decode", "prefill", "score"}) {
    EXPECT_GT(busy->MetricValue(std::string("riskkv_queue_wait_seconds_count{kind=\"") + kind +
                                "\",model=\"tiny\"}"),
              0)
        << kind << "\n"
        << m;
  }
}

TEST_F(Nodes, SampledSessionsResumeTheSameRngStream) {
  auto a = Start(true), b = Start(false);
  const std::string stay = StartSession(*a, 0.9f), move = StartSession(*a, 0.9f);
  ASSERT_TRUE(Generate(*a, stay, 4).ok());
  ASSERT_TRUE(Generate(*a, move, 4).ok());
  v1::MigrateReply reply;
  ASSERT_TRUE(Migrate(*a, move, *b, v1::FULL_KV, &reply).ok());
  ASSERT_TRUE(Generate(*b, reply.target_session_id(), 20).ok());
  ASSERT_TRUE(Generate(*a, stay, 20).ok());
  EXPECT_EQ(Tokens(*b, reply.target_session_id()), Tokens(*a, stay));
}

TEST_F(Nodes, RefusedHandshakeFallsBackOrLeavesTheSessionOnTheSource) {
  auto a = Start(true), b = Start(false);  // b has no policy: RECONSTRUCT is refused
  const std::string id = StartSession(*a);
  const auto before = Tokens(*a, id);
  v1::MigrateReply reply;
  grpc::Status s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("no retention policy"), std::string::npos) << s.error_message();
  EXPECT_EQ(Tokens(*a, id), before);  // intact and usable
  ASSERT_TRUE(Generate(*a, id, 2).ok());

  s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply, /*fallback=*/true);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::FULL_KV);
  EXPECT_NE(reply.mode_reason().find("fallback: reconstruct refused"), std::string::npos)
      << reply.mode_reason();
  EXPECT_NE(a->Metrics().find("reason=\"handshake_refused\",role=\"source\"} 2"), std::string::npos)
      << a->Metrics();
  EXPECT_NE(b->Metrics().find("reason=\"handshake\",role=\"target\"} 2"), std::string::npos)
      << b->Metrics();
}

TEST_F(Nodes, UnreachableOrStoppedTargetLeavesTheSessionOnTheSource) {
  auto a = Start(true), b = Start(true);
  const std::string id = StartSession(*a);
  const std::string dead = b->address;
  b->server->Shutdown();
  v1::MigrateReply reply;
  const grpc::Status s = Migrate(*a, id, *b, v1::FULL_KV, &reply, true, dead);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  EXPECT_NE(s.error_message().find("stays on this node"), std::string::npos);
  ASSERT_TRUE(Generate(*a, id, 3).ok());
  // And a retry to another node succeeds.
  auto c = Start(true);
  EXPECT_TRUE(Migrate(*a, id, *c, v1::RECONSTRUCT, &reply).ok());
}

// A target that plays along until the commit and then fails: the session must stay on the source.
// A fake node on an ephemeral port, its server in *server.
TestNode Serve(grpc::Service& service, std::unique_ptr<grpc::Server>* server) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  *server = builder.BuildAndStart();
  TestNode n;
  n.address = "127.0.0.1:" + std::to_string(port);
  return n;
}

// Sessions a node lists (listing does not count as using them).
int Count(TestNode& n) {
  grpc::ClientContext ctx;
  v1::ListSessionsReply all;
  EXPECT_TRUE(n.stub->ListSessions(&ctx, {}, &all).ok());
  return all.sessions_size();
}

class FailsAtCommit final : public v1::Node::Service {
 public:
  grpc::Status Receive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream) override {
    v1::MigrationFrame f;
    v1::ReceiveReply r;
    while (stream->Read(&f)) {
      if (f.has_handshake()) {
        r.mutable_accepted();
        stream->Write(r);
      } else if (f.has_trailer()) {
        r.mutable_resumed();
        stream->Write(r);
      } else if (f.has_commit()) {
        commits_seen++;
        return grpc::Status(grpc::StatusCode::INTERNAL, "disk full while registering");
      }
    }
    return grpc::Status(grpc::StatusCode::ABORTED, "stream ended");
  }
  std::atomic<int> commits_seen{0};
};

TEST_F(Nodes, ATargetFailingAtTheCommitLeavesTheSessionOnTheSource) {
  auto a = Start(true);
  FailsAtCommit fake;
  std::unique_ptr<grpc::Server> server;
  TestNode target = Serve(fake, &server);
  const std::string id = StartSession(*a);
  ASSERT_TRUE(Generate(*a, id, 3).ok());
  const auto before = Tokens(*a, id);
  v1::MigrateReply reply;
  const grpc::Status s = Migrate(*a, id, target, v1::FULL_KV, &reply);
  EXPECT_EQ(fake.commits_seen, 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
  EXPECT_NE(s.error_message().find("did not confirm the hand-over"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(Tokens(*a, id), before);  // back on the source, unchanged and usable
  EXPECT_TRUE(Generate(*a, id, 2).ok());
  server->Shutdown();
}

// Relays a migration to a real target like a network that partitions at the commit: either the
// target's confirmation is lost on its way back, or the commit itself never reaches the target.
// The outcome question passes through.
class PartitionsAtTheCommit final : public v1::Node::Service {
 public:
  PartitionsAtTheCommit(const std::string& target, bool lose_commit)
      : stub_(v1::Node::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))),
        lose_commit_(lose_commit) {}
  grpc::Status Receive(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ReceiveReply, v1::MigrationFrame>* stream) override {
    grpc::ClientContext ctx;
    auto up = stub_->Receive(&ctx);
    v1::MigrationFrame f;
    v1::ReceiveReply r;
    const grpc::Status partition(grpc::StatusCode::UNAVAILABLE, "partitioned");
    while (stream->Read(&f)) {
      if (f.has_commit() && lose_commit_) return partition;
      if (!up->Write(f)) break;
      if (!f.has_chunk()) {  // every other frame is answered
        if (!up->Read(&r)) break;
        if (r.has_committed()) {
          confirmations_lost++;
          up->WritesDone();
          (void)up->Finish();
          return partition;
        }
        stream->Write(r);
      }
    }
    return grpc::Status(grpc::StatusCode::ABORTED, "relay ended");
  }
  grpc::Status MigrationOutcome(grpc::ServerContext*, const v1::MigrationOutcomeRequest* req,
                                v1::MigrationOutcomeReply* reply) override {
    outcome_questions++;
    if (outcomes_partitioned) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "partitioned");
    grpc::ClientContext ctx;
    return stub_->MigrationOutcome(&ctx, *req, reply);
  }
  std::atomic<int> confirmations_lost{0};
  // While set, the source's questions about the outcome do not reach the target either.
  std::atomic<bool> outcomes_partitioned{false};
  std::atomic<int> outcome_questions{0};

 private:
  std::unique_ptr<v1::Node::Stub> stub_;
  const bool lose_commit_;
};

// After a migration through a relay that lost the commit or its confirmation: the session is in
// exactly one place, unchanged and usable there, and a refused hand-over's error says `why`.
struct OneCopy : Nodes {
  static void Expect(TestNode& a, TestNode& b, const std::string& id,
                     const std::vector<int32_t>& before, bool lose_commit, const grpc::Status& s,
                     const v1::MigrateReply& reply, const std::string& why) {
    if (!lose_commit) {
      // B took the session; asked, it says so, and A lets it go.
      ASSERT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(Count(a), 0);
      ASSERT_EQ(Count(b), 1);
      EXPECT_EQ(Tokens(b, reply.target_session_id()), before);
      EXPECT_TRUE(Generate(b, reply.target_session_id(), 2).ok());
    } else {
      // B never saw the commit; asked, it says no (and would now refuse it), and A serves on.
      EXPECT_FALSE(s.ok());
      EXPECT_NE(s.error_message().find(why), std::string::npos) << s.error_message();
      EXPECT_EQ(Tokens(a, id), before);
      EXPECT_TRUE(Generate(a, id, 2).ok());
      EXPECT_EQ(Count(a), 1);
      for (int i = 0; i < 200 && Count(b) > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_EQ(Count(b), 0);
    }
  }
};

TEST_F(Nodes, ALostCommitOrConfirmationLeavesExactlyOneCopyOfTheSession) {
  for (bool lose_commit : {false, true}) {
    SCOPED_TRACE(lose_commit ? "the commit is lost" : "the confirmation is lost");
    auto a = Start(true), b = Start(true);
    PartitionsAtTheCommit relay(b->address, lose_commit);
    std::unique_ptr<grpc::Server> server;
    TestNode via = Serve(relay, &server);
    const std::string id = StartSession(*a);
    ASSERT_TRUE(Generate(*a, id, 3).ok());
    const auto before = Tokens(*a, id);
    v1::MigrateReply reply;
    const grpc::Status s = Migrate(*a, id, via, v1::FULL_KV, &reply);
    if (!lose_commit) {
      EXPECT_EQ(relay.confirmations_lost, 1);
    }
    OneCopy::Expect(*a, *b, id, before, lose_commit, s, reply,
                    "it says it did not take the session");
    server->Shutdown();
  }
}

// The partition outlasts the migration's deadline: the source cannot learn whether the target
// took the session. It holds the session, served by neither node, asks on, and once the target
// can be asked again the session is in exactly one place.
TEST_F(Nodes, ASessionInDoubtIsHeldUntilItsTargetCanBeAsked) {
  for (bool lose_commit : {false, true}) {
    SCOPED_TRACE(lose_commit ? "the commit is lost" : "the confirmation is lost");
    auto a = Start(true), b = Start(true);
    PartitionsAtTheCommit relay(b->address, lose_commit);
    relay.outcomes_partitioned = true;
    std::unique_ptr<grpc::Server> server;
    TestNode via = Serve(relay, &server);
    const std::string id = StartSession(*a);
    ASSERT_TRUE(Generate(*a, id, 3).ok());
    const auto before = Tokens(*a, id);
    v1::MigrateReply reply;
    auto migrated = std::async(std::launch::async, [&] {
      return Migrate(*a, id, via, v1::FULL_KV, &reply, false, "", /*timeout_seconds=*/1.5);
    });
    const std::string held = "riskkv_sessions_in_doubt{model=\"tiny\"} 1";
    EXPECT_NE(a->AwaitMetrics(held).find(held), std::string::npos);
    // Past the migration's deadline, the session is still held: neither node serves it.
    std::this_thread::sleep_for(std::chrono::milliseconds(1700));
    EXPECT_EQ(migrated.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
      v1::GenerateRequest req;
      req.set_session_id(id);
      req.set_max_tokens(1);
      auto reader = a->stub->Generate(&ctx, req);
      v1::GenerateReply r;
      EXPECT_FALSE(reader->Read(&r)) << "the held session generated on the source";
      EXPECT_FALSE(reader->Finish().ok());
    }
    EXPECT_GT(relay.outcome_questions, 2);
    relay.outcomes_partitioned = false;  // the partition heals
    const grpc::Status s = migrated.get();
    const std::string released = "riskkv_sessions_in_doubt{model=\"tiny\"} 0";
    EXPECT_NE(a->AwaitMetrics(released).find(released), std::string::npos);
    OneCopy::Expect(*a, *b, id, before, lose_commit, s, reply,
                    "in doubt, the session held here, it says it did not take the session");
    server->Shutdown();
  }
}

// With a bound on the hold (--in-doubt-seconds), a partition that outlasts it gives the session
// back to the source, and the error says the session may now be on both nodes' sides.
TEST_F(Nodes, ABoundedHoldServesTheSessionAgainWhenItEnds) {
  auto a = Start(true, 0, 3e-3, [](NodeOptions& o) { o.in_doubt_seconds = 0.8; });
  auto b = Start(true);
  PartitionsAtTheCommit relay(b->address, /*lose_commit=*/true);
  relay.outcomes_partitioned = true;
  std::unique_ptr<grpc::Server> server;
  TestNode via = Serve(relay, &server);
  const std::string id = StartSession(*a);
  const auto before = Tokens(*a, id);
  v1::MigrateReply reply;
  const grpc::Status s = Migrate(*a, id, via, v1::FULL_KV, &reply, false, "", 1.0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("it could not be asked whether it took the session"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("now served here again"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(a->MetricValue("riskkv_sessions_in_doubt{model=\"tiny\"}"), 0);
  EXPECT_EQ(Tokens(*a, id), before);
  EXPECT_TRUE(Generate(*a, id, 2).ok());
  server->Shutdown();
}

TEST_F(Nodes, ChainsAndConcurrentMigrations) {
  auto a = Start(true), b = Start(true), c = Start(true);
  const std::string x = StartSession(*a), y = StartSession(*a);
  // Two sessions leave A at once, to different nodes.
  auto fx = std::async(std::launch::async, [&] {
    v1::MigrateReply r;
    return std::make_pair(Migrate(*a, x, *b, v1::RECONSTRUCT, &r), r);
  });
  auto fy = std::async(std::launch::async, [&] {
    v1::MigrateReply r;
    return std::make_pair(Migrate(*a, y, *c, v1::FULL_KV, &r), r);
  });
  auto [sx, rx] = fx.get();
  auto [sy, ry] = fy.get();
  ASSERT_TRUE(sx.ok()) << sx.error_message();
  ASSERT_TRUE(sy.ok()) << sy.error_message();
  // x goes on: B -> C -> A.
  v1::MigrateReply r2, r3;
  ASSERT_TRUE(Migrate(*b, rx.target_session_id(), *c, v1::RECONSTRUCT, &r2).ok());
  ASSERT_TRUE(Migrate(*c, r2.target_session_id(), *a, v1::TOKEN_REPLAY, &r3).ok());
  EXPECT_TRUE(Generate(*a, r3.target_session_id(), 4).ok());
  EXPECT_TRUE(Generate(*c, ry.target_session_id(), 4).ok());
}

// RECONSTRUCT through two nodes costs each held-out request the NLL change calibration measured
// offline for it, so the continuation stays under the policy's recorded bound.
TEST_F(Nodes, ReconstructKeepsThePolicysMeasuredNll) {
  // Offline and served paths run the same f32 arithmetic over f32 KV on the same rows.
  constexpr double kTolerance = 1e-5;
  auto a = Start(true), b = Start(true);
  const RetentionPolicy& p = (*retention_)->policy;
  ASSERT_EQ(p.test_delta_nll.requests, static_cast<int>(tiny_->test_requests.size()));
  double sum = 0;
  for (size_t r = 0; r < tiny_->test_requests.size(); ++r) {
    const Request& q = tiny_->test_requests[r];
    const std::vector<int32_t> history(q.tokens.begin(), q.tokens.begin() + q.history);
    const std::vector<int32_t> continuation(q.tokens.begin() + q.history, q.tokens.end());
    const std::string stay = StartSession(*a, 0, history), move = StartSession(*a, 0, history);
    v1::MigrateReply reply;
    const grpc::Status s = Migrate(*a, move, *b, v1::RECONSTRUCT, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const double delta =
        Score(*b, reply.target_session_id(), continuation) - Score(*a, stay, continuation);
    std::printf("request %zu: dNLL %+.9f migrated, %+.9f offline\n", r, delta,
                tiny_->test_deltas[r]);
    EXPECT_NEAR(delta, tiny_->test_deltas[r], kTolerance) << "request " << r;
    sum += delta;
  }
  // Each request matching, so does their mean (the policy's recorded figure); printed only.
  std::printf("mean dNLL %+.6f; the policy's: %+.6f [95%% CI up to %+.6f]\n",
              sum / static_cast<double>(tiny_->test_requests.size()), p.test_delta_nll.mean,
              p.test_delta_nll.ci_high);
}

TEST_F(Nodes, ARetentionSwapAppliesToLaterMigrations) {
  auto a = Start(true), b = Start(false);
  EXPECT_NE(b->Metrics().find("riskkv_policy_version{model=\"tiny\"} 0"), std::string::npos);
  const std::string id = StartSession(*a);
  v1::MigrateReply reply;
  grpc::Status s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("no retention policy"), std::string::npos) << s.error_message();
  // B receives a newer version of the policy (same bank): A's version 3 no longer matches.
  RetentionPolicy newer = (*retention_)->policy;
  newer.version = 4;
  auto v4 = MakeRetention(newer, (*retention_)->bank);
  ASSERT_TRUE(v4.ok()) << v4.status();
  b->service->SetRetention(*v4);
  EXPECT_NE(b->Metrics().find("riskkv_policy_version{model=\"tiny\"} 4"), std::string::npos);
  s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("version 3 is not this node's tiny version 4"),
            std::string::npos)
      << s.error_message();
  // With fallback the stale version costs a FULL_KV migration, and the reply says why.
  const std::string other = StartSession(*a);
  s = Migrate(*a, other, *b, v1::RECONSTRUCT, &reply, /*fallback=*/true);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::FULL_KV);
  EXPECT_NE(reply.mode_reason().find("fallback: reconstruct refused"), std::string::npos)
      << reply.mode_reason();
  EXPECT_NE(b->Metrics().find("reason=\"handshake\",role=\"target\"} 3"), std::string::npos)
      << b->Metrics();
  // A follows: the next migration runs.
  a->service->SetRetention(*v4);
  s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::RECONSTRUCT);
  EXPECT_GT(reply.kv_bytes_omitted(), 0);
  // A policy whose gate fell back to exact KV rebuilds nothing and needs no bank: RECONSTRUCT
  // then sends every layer.
  RetentionPolicy exact = testing::KeepingEveryLayer(
      (*retention_)->policy, static_cast<int32_t>(a->model->config().n_layers));
  exact.version = 5;
  auto v5 = MakeRetention(exact, nullptr);
  ASSERT_TRUE(v5.ok()) << v5.status();
  a->service->SetRetention(*v5);
  b->service->SetRetention(*v5);
  const std::string whole = StartSession(*a);
  s = Migrate(*a, whole, *b, v1::RECONSTRUCT, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::RECONSTRUCT);
  EXPECT_EQ(reply.kv_bytes_omitted(), 0);
  // ... but a policy that rebuilds layers does.
  EXPECT_FALSE(MakeRetention((*retention_)->policy, nullptr).ok());

  // A node without a policy asked for RECONSTRUCT falls back instead of failing.
  auto c = Start(false);
  const std::string x = StartSession(*c);
  s = Migrate(*c, x, *a, v1::RECONSTRUCT, &reply, /*fallback=*/true);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::FULL_KV);
  EXPECT_NE(reply.mode_reason().find("has no retention policy"), std::string::npos)
      << reply.mode_reason();
}

TEST_F(Nodes, ATargetBoundsItsIncomingMigrationsInNumberAndTime) {
  // 1 Mbit/s sources: a 150-token session's 300 KiB of KV take about 2 s to send (after the
  // bucket's 64 KiB burst).
  auto slow1 = Start(true, 1), slow2 = Start(true, 1);
  auto target = Start(true, 0, 3e-3, [](NodeOptions& o) { o.max_concurrent_receives = 1; });
  const std::string x = StartSession(*slow1), y = StartSession(*slow2);
  ASSERT_TRUE(Generate(*slow1, x, 120).ok());
  ASSERT_TRUE(Generate(*slow2, y, 120).ok());
  auto first = std::async(std::launch::async, [&] {
    v1::MigrateReply r;
    return Migrate(*slow1, x, *target, v1::FULL_KV, &r);
  });
  // Wait until the first migration holds its session, then give it time to reach the target.
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(x);
    v1::SessionInfo info;
    if (slow1->stub->GetSession(&ctx, req, &info).error_code() ==
        grpc::StatusCode::FAILED_PRECONDITION) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  v1::MigrateReply reply;
  grpc::Status s = Migrate(*slow2, y, *target, v1::FULL_KV, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("already receiving its limit of 1"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(Generate(*slow2, y, 1).ok());  // the refused session stays usable
  EXPECT_TRUE(first.get().ok());
  EXPECT_NE(target->Metrics().find("reason=\"busy\",role=\"target\"} 1"), std::string::npos);

  // A target that allows a receive 0.5 s cuts a 2.5 s transfer off; the session stays home.
  auto strict = Start(true, 0, 3e-3, [](NodeOptions& o) { o.default_timeout_seconds = 0.5; });
  const auto t0 = std::chrono::steady_clock::now();
  s = Migrate(*slow2, y, *strict, v1::FULL_KV, &reply);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("stays on this node"), std::string::npos) << s.error_message();
  // The source saw a cancelled stream; it asked the target why.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find("the target cut the stream off: the migration did not finish "
                                   "within the target's bound of 0.5 s"),
            std::string::npos)
      << s.error_message();
  EXPECT_LT(took, 2.0) << s.error_message();
  EXPECT_TRUE(Generate(*slow2, y, 1).ok());
  grpc::ClientContext lc;
  v1::ListSessionsReply list;
  ASSERT_TRUE(strict->stub->ListSessions(&lc, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 0);

  // A target that hears nothing for 0.1 s cuts a 0.5 Mbit/s source off between its chunks (one
  // layer's K or V rows, about 19 KB: 0.3 s each after the first 64 KiB); the source learns which
  // bound it was, and the target counts it as the idle bound's doing, not as a truncated stream.
  auto big_chunks = [](NodeOptions& o) { o.max_chunk_bytes = 64 << 10; };
  auto impatient = Start(true, 0, 3e-3, [&](NodeOptions& o) {
    big_chunks(o);
    o.receive_idle_seconds = 0.1;
  });
  auto slow3 = Start(true, 0.5, 3e-3, big_chunks);
  const std::string w = StartSession(*slow3);
  ASSERT_TRUE(Generate(*slow3, w, 120).ok());
  s = Migrate(*slow3, w, *impatient, v1::FULL_KV, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find("the target cut the stream off: the source sent nothing for "
                                   "0.1 s"),
            std::string::npos)
      << s.error_message();
  EXPECT_TRUE(Generate(*slow3, w, 1).ok());
  const std::string idle_counted =
      "riskkv_migration_failures_total{model=\"tiny\",reason=\"idle\",role=\"target\"} 1";
  const std::string im = impatient->AwaitMetrics(idle_counted);
  EXPECT_NE(im.find(idle_counted), std::string::npos) << im;
  EXPECT_EQ(im.find("reason=\"truncated\""), std::string::npos) << im;

  // A peer that opens a receive and sends no handshake loses its slot after the handshake bound
  // (well before the idle one), and the slot serves the next migration.
  auto guarded = Start(true, 0, 3e-3, [](NodeOptions& o) {
    o.max_concurrent_receives = 1;
    o.receive_idle_seconds = 30;
    o.receive_handshake_seconds = 0.3;
  });
  grpc::ClientContext stall_ctx;
  auto stalled = guarded->stub->Receive(&stall_ctx);
  const auto s0 = std::chrono::steady_clock::now();
  v1::ReceiveReply nothing;
  EXPECT_FALSE(stalled->Read(&nothing));  // the node ends the stream
  const grpc::Status cut = stalled->Finish();
  EXPECT_FALSE(cut.ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count(), 5.0);
  // Counted as the missing handshake's doing, not as a truncated stream (the handler counts it
  // as it returns, which may come after the client saw the stream end).
  const std::string counted =
      "riskkv_migration_failures_total{model=\"tiny\",reason=\"no_handshake\",role=\"target\"} 1";
  const std::string m = guarded->AwaitMetrics(counted);
  EXPECT_NE(m.find(counted), std::string::npos) << m;
  EXPECT_EQ(m.find("reason=\"truncated\""), std::string::npos) << m;
  auto quick = Start(true);
  const std::string z = StartSession(*quick);
  s = Migrate(*quick, z, *guarded, v1::FULL_KV, &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(Nodes, ATargetCutsOffASourceSlowerThanItsMinimumRate) {
  // 16 KiB chunks and a 64 KiB/s minimum: a grace of 0.5 s (twice one chunk's time at the
  // minimum). A 0.1 Mbit/s source (12.5 KB/s after its 64 KiB burst) falls behind and is cut
  // off; a 1 Mbit/s one keeps up and moves.
  auto small_chunks = [](NodeOptions& o) { o.max_chunk_bytes = 16 << 10; };
  auto target = Start(true, 0, 3e-3, [](NodeOptions& o) {
    o.max_chunk_bytes = 16 << 10;
    o.min_receive_bytes_per_second = 64 << 10;
    o.receive_rate_grace_seconds = 0.5;
  });
  auto trickle = Start(true, 0.1, 3e-3, small_chunks), steady = Start(true, 1, 3e-3, small_chunks);
  const std::string x = StartSession(*trickle), y = StartSession(*steady);
  ASSERT_TRUE(Generate(*trickle, x, 120).ok());
  ASSERT_TRUE(Generate(*steady, y, 120).ok());
  v1::MigrateReply reply;
  const auto t0 = std::chrono::steady_clock::now();
  grpc::Status s = Migrate(*trickle, x, *target, v1::FULL_KV, &reply);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find("the target cut the stream off: the source sent "),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("below the target's minimum of 65536 bytes/s"),
            std::string::npos)
      << s.error_message();
  EXPECT_LT(took, 10.0) << "the whole transfer would take about 25 s; " << s.error_message();
  EXPECT_TRUE(Generate(*trickle, x, 1).ok()) << "the session stays on its source";
  const std::string counted =
      "riskkv_migration_failures_total{model=\"tiny\",reason=\"slow\",role=\"target\"} 1";
  const std::string m = target->AwaitMetrics(counted);
  EXPECT_NE(m.find(counted), std::string::npos) << m;
  s = Migrate(*steady, y, *target, v1::FULL_KV, &reply);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(Nodes, SessionsIdlePastTheTtlAreClosedAndCountedBusyOnesStay) {
  auto n = Start(true, 0, 3e-3, [](NodeOptions& o) {
    o.session_idle_ttl_seconds = 0.3;
    o.generate_step = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  });
  const std::string idle = StartSession(*n), busy = StartSession(*n);
  // Generating for 0.8 s, past the TTL: a session in use never expires.
  auto tokens = Generate(*n, busy, 40);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  auto info = [&](const std::string& id) {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::SessionInfo out;
    return n->stub->GetSession(&ctx, req, &out);
  };
  EXPECT_TRUE(info(busy).ok()) << "just used";
  const grpc::Status gone = info(idle);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND) << gone.error_message();
  // Listing does not count as using a session: the other one goes too, once idle past the TTL.
  for (int i = 0; i < 300 && Count(*n) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Count(*n), 0);
  EXPECT_EQ(info(busy).error_code(), grpc::StatusCode::NOT_FOUND) << "idle since";
  // The reaper counts a session after it left the table.
  const std::string expired = "riskkv_sessions_expired_total{model=\"tiny\"} 2";
  const std::string m = n->AwaitMetrics(expired);
  EXPECT_NE(m.find(expired), std::string::npos) << m;
  EXPECT_NE(m.find("riskkv_active_sessions{model=\"tiny\"} 0"), std::string::npos) << m;
}

TEST_F(Nodes, AutoPicksTheFastestEstimateAndSaysWhy) {
  struct Case {
    double link_mbps, prefill_seconds_per_token;
    v1::MigrationMode expect;
  };
  // 31 history tokens: 63 KiB of f32 KV in all, half of it under the policy.
  for (const Case& c : {Case{0, 3e-3, v1::FULL_KV},         // 1 Gbit/s: the wire is free
                        Case{0.1, 3e-3, v1::TOKEN_REPLAY},  // 100 kbit/s: replay wins
                        Case{10, 1.0, v1::RECONSTRUCT}}) {  // slow prefill, modest link
    // Speeds pinned: the cases set them rather than measure them.
    auto pin = [](NodeOptions& o) { o.measure_speeds = false; };
    auto a = Start(true, c.link_mbps, c.prefill_seconds_per_token, pin), b = Start(true);
    const std::string id = StartSession(*a);
    v1::MigrateReply reply;
    const grpc::Status s = Migrate(*a, id, *b, v1::AUTO, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.mode(), c.expect) << reply.mode_reason();
    EXPECT_EQ(reply.mode_reason().rfind("auto: estimated reconstruct ", 0), 0u)
        << reply.mode_reason();
  }
  // The target lacks the bank: AUTO learns it at the handshake and runs the next fastest.
  auto a = Start(true, 10, 1.0, [](NodeOptions&o) { o.measure_speeds = false; }), b = Start(false);
  const std::string id = StartSession(*a);
  v1::MigrateReply reply;
  grpc::Status s = Migrate(*a, id, *b, v1::AUTO, &reply, /*fallback=*/true);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::FULL_KV);
  EXPECT_NE(reply.mode_reason().find("; fallback: reconstruct refused (target"), std::string::npos)
      << reply.mode_reason();
  // Without fallback AUTO tries its first choice only.
  const std::string id2 = StartSession(*a);
  s = Migrate(*a, id2, *b, v1::AUTO, &reply, /*fallback=*/false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(Generate(*a, id2, 1).ok());
}

TEST_F(Nodes, AutoUsesTheSpeedsItMeasured) {
  auto a = Start(true), b = Start(true);
  StartSession(*b);  // B measures its prefill speed
  std::string id = StartSession(*a);
  v1::MigrateReply reply;
  // Before any migration to B the link rate is assumed; the prefill speed is A's own, measured
  // on the session's prefill.
  ASSERT_TRUE(Migrate(*a, id, *b, v1::AUTO, &reply).ok());
  EXPECT_NE(reply.mode_reason().find("Mbit/s (assumed)"), std::string::npos) << reply.mode_reason();
  EXPECT_NE(reply.mode_reason().find("ms/token (measured here)"), std::string::npos)
      << reply.mode_reason();
  // A FULL_KV migration of 100 KiB measures the rate to B (the wire alone, so at least the
  // rate over the whole transfer the reply reports), and B reported its prefill speed.
  id = StartSession(*a);
  ASSERT_TRUE(Generate(*a, id, 20).ok());
  ASSERT_TRUE(Migrate(*a, id, *b, v1::FULL_KV, &reply).ok());
  const double measured = reply.kv_bytes_sent() * 8 / reply.transfer_seconds() / 1e6;
  id = StartSession(*a);
  ASSERT_TRUE(Migrate(*a, id, *b, v1::AUTO, &reply).ok());
  const std::string& why = reply.mode_reason();
  const size_t at = why.find(" Mbit/s (measured to the target)");
  ASSERT_NE(at, std::string::npos) << why;
  const double used = std::stod(why.substr(why.rfind(' ', at - 1) + 1));
  EXPECT_GE(used, measured * (1 - 1e-3)) << why;
  EXPECT_LT(used, measured * 20) << why;
  EXPECT_NE(why.find("ms/token (the target's)"), std::string::npos) << why;
  // A configured link limit wins over a faster measurement (the token bucket's burst makes
  // short transfers look faster than the link).
  auto c = Start(true, /*link_mbps=*/10);
  id = StartSession(*c);
  ASSERT_TRUE(Generate(*c, id, 20).ok());
  ASSERT_TRUE(Migrate(*c, id, *b, v1::FULL_KV, &reply).ok());
  id = StartSession(*c);
  ASSERT_TRUE(Migrate(*c, id, *b, v1::AUTO, &reply).ok());
  EXPECT_NE(reply.mode_reason().find("at 10 Mbit/s (--link-mbps)"), std::string::npos)
      << reply.mode_reason();
}

TEST_F(Nodes, BadRequestsGetPreciseStatusesAndHarmNothing) {
  auto a = Start(true), b = Start(true, /*link_mbps=*/2);  // slow link: migrations take a while
  const std::string id = StartSession(*a);
  ASSERT_TRUE(Generate(*a, id, 30).ok());
  v1::MigrateReply reply;
  EXPECT_EQ(Migrate(*a, "nope", *b, v1::FULL_KV, &reply).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Migrate(*a, id, *b, static_cast<v1::MigrationMode>(17), &reply).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Migrate(*a, id, *b, v1::FULL_KV, &reply, false, "").error_code(), grpc::StatusCode::OK);
  // The session is on B now; migrating it twice at once: one wins, the other is refused as busy.
  const std::string on_b = reply.target_session_id();
  auto first = std::async(std::launch::async, [&] {
    v1::MigrateReply r;
    return Migrate(*b, on_b, *a, v1::FULL_KV, &r);
  });
  // Wait until the first migration holds the session.
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext c;
    v1::GetSessionRequest g;
    g.set_session_id(on_b);
    v1::SessionInfo info;
    if (b->stub->GetSession(&c, g, &info).error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  v1::MigrateReply r2;
  const grpc::Status second = Migrate(*b, on_b, *a, v1::FULL_KV, &r2);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << second.error_message();
  EXPECT_NE(second.error_message().find("already migrating"), std::string::npos)
      << second.error_message();
  EXPECT_TRUE(first.get().ok());
  // The session lives on exactly one node.
  grpc::ClientContext c1;
  v1::GetSessionRequest g;
  g.set_session_id(on_b);
  v1::SessionInfo gone;
  EXPECT_EQ(b->stub->GetSession(&c1, g, &gone).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext c2;
  v1::ListSessionsReply list;
  ASSERT_TRUE(a->stub->ListSessions(&c2, {}, &list).ok());
  ASSERT_EQ(list.sessions_size(), 1);
  EXPECT_EQ(list.sessions(0).tokens(), 30 + 30);  // the prompt and 30 generated tokens
  EXPECT_FALSE(list.sessions(0).busy());

  grpc::ClientContext ctx;
  v1::StartSessionRequest both;
  both.set_prompt("hello");
  both.add_token_ids(3);
  v1::SessionInfo info;
  EXPECT_EQ(a->stub->StartSession(&ctx, both, &info).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext ctx2;
  v1::StartSessionRequest big;
  big.add_token_ids(100000);
  EXPECT_EQ(a->stub->StartSession(&ctx2, big, &info).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Everything still works.
  EXPECT_TRUE(Generate(*a, StartSession(*a), 2).ok());
}

// The policy of retention_ calibrated for `form`, with the same bank.
std::shared_ptr<const Retention> RetentionIn(const std::shared_ptr<const Retention>& r,
                                             const std::string& form) {
  RetentionPolicy p = r->policy;
  p.wire_form = form;
  auto made = MakeRetention(std::move(p), r->bank);
  EXPECT_TRUE(made.ok()) << made.status();
  return *made;
}

TEST_F(Nodes, QuantizedWireFormsMoveFewerBytesAndTheSessionDecodesOn) {
  const std::shared_ptr<const Retention> int8 = RetentionIn(*retention_, "int8");
  auto with_int8 = [&](NodeOptions& o) { o.retention = int8; };
  auto a = Start(false, 0, 3e-3, with_int8), b = Start(false, 0, 3e-3, with_int8);
  const ModelConfig& c = a->engine->config();
  std::vector<int32_t> x;
  for (int i = 0; i < 16; ++i) x.push_back((i * 97 + 13) % 500);
  for (auto mode : {v1::FULL_KV, v1::RECONSTRUCT}) {
    SCOPED_TRACE(v1::MigrationMode_Name(mode));
    const std::string stay = StartSession(*a), move = StartSession(*a);
    ASSERT_TRUE(Generate(*a, stay, 5).ok());
    ASSERT_TRUE(Generate(*a, move, 5).ok());
    const double ref = Score(*a, stay, x);
    const int64_t history = 30 + 5 - 1;
    v1::MigrateReply reply;
    grpc::ClientContext ctx;
    v1::MigrateRequest req;
    req.set_session_id(move);
    req.set_target_address(b->address);
    req.set_mode(mode);
    // FULL_KV's form; RECONSTRUCT sends the policy's int8 whatever the request says, unless
    // rebuilt_groups names another rung of its ladder.
    req.set_wire_form(mode == v1::FULL_KV ? v1::KV_WIRE_INT8 : v1::KV_WIRE_INT4);
    const grpc::Status s = a->stub->Migrate(&ctx, req, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.mode(), mode);
    EXPECT_EQ(reply.wire_form(), v1::KV_WIRE_INT8);
    const int64_t layers = mode == v1::FULL_KV ? c.n_layers : 4;
    EXPECT_EQ(reply.kv_bytes_sent(), StreamKvBytes(WireForm::kInt8, history, layers, c.n_kv_heads,
                                                   c.head_dim, DType::kF32));
    EXPECT_LT(reply.kv_bytes_sent(), StreamKvBytes(WireForm::kPlain, history, layers, c.n_kv_heads,
                                                   c.head_dim, DType::kF32) /
                                         3);
    EXPECT_EQ(reply.kv_bytes_omitted(), mode == v1::FULL_KV
                                            ? 0
                                            : StreamKvBytes(WireForm::kInt8, history, 4,
                                                            c.n_kv_heads, c.head_dim, DType::kF32));
    // The moved session continues: its continuation's NLL close to the exact one, but not it.
    const double moved = Score(*b, reply.target_session_id(), x);
    std::fprintf(stderr, "%s int8: continuation NLL %.5f vs %.5f exact\n",
                 v1::MigrationMode_Name(mode).c_str(), moved, ref);
    EXPECT_NE(moved, ref);
    EXPECT_LT(std::abs(moved - ref), 0.1 * ref);
    EXPECT_EQ(Tokens(*b, reply.target_session_id()), Tokens(*a, stay));
    auto more = Generate(*b, reply.target_session_id(), 12);
    ASSERT_TRUE(more.ok()) << more.status();
    EXPECT_EQ(more->size(), 12u);
  }
  EXPECT_NE(a->Metrics().find("riskkv_migrations_total{mode=\"reconstruct\",model=\"tiny\","
                              "outcome=\"ok\",role=\"source\"} 1"),
            std::string::npos)
      << a->Metrics();
}

// Score compares two copies of a session as llama.cpp's perplexity tool compares two models: one
// copy's top tokens per position (return_top) are the reference the other is scored against,
// giving the KL divergence and the top-1 agreement beside the NLL. A FULL_KV copy matches its
// source exactly; a rebuilt one differs a little; bad references are refused.
TEST_F(Nodes, ScoreGivesKlAndTopOneAgreementAgainstAnotherCopysReference) {
  auto a = Start(true), b = Start(true);
  std::vector<int32_t> x;
  for (int i = 0; i < 12; ++i) x.push_back((i * 89 + 5) % 500);
  const std::string stay = StartSession(*a);
  ASSERT_TRUE(Generate(*a, stay, 4).ok());
  auto score = [&](TestNode& n, const std::string& id, bool top,
                   const google::protobuf::RepeatedPtrField<v1::TopLogProbs>* reference,
                   v1::ScoreReply* reply) {
    grpc::ClientContext ctx;
    v1::ScoreRequest req;
    req.set_session_id(id);
    for (int32_t t : x) req.add_token_ids(t);
    req.set_return_top(top);
    if (reference != nullptr) *req.mutable_reference() = *reference;
    return n.stub->Score(&ctx, req, reply);
  };
  const int64_t vocab = a->engine->config().vocab;
  v1::ScoreReply ref;
  ASSERT_TRUE(score(*a, stay, true, nullptr, &ref).ok());
  ASSERT_EQ(ref.top_size(), static_cast<int>(x.size()));
  for (const v1::TopLogProbs& t : ref.top()) {
    ASSERT_EQ(t.token_ids_size(), static_cast<int>(kTopTokens));
    EXPECT_TRUE(CheckTopLogProbs(std::span<const int32_t>(t.token_ids().data(), kTopTokens),
                                 std::span<const float>(t.logprobs().data(), kTopTokens), vocab)
                    .ok());
  }
  EXPECT_EQ(ref.mean_kl(), 0.0);  // no reference given: no comparison
  // Against itself: the same NLL, no divergence, every top token agreeing.
  v1::ScoreReply self;
  ASSERT_TRUE(score(*a, stay, false, &ref.top(), &self).ok());
  EXPECT_EQ(self.mean_nll(), ref.mean_nll());
  EXPECT_LT(self.mean_kl(), 1e-6);
  EXPECT_EQ(self.top1_agreement(), 1.0);
  EXPECT_EQ(self.top_size(), 0);
  for (auto [mode, exact] : {std::pair{v1::FULL_KV, true}, std::pair{v1::RECONSTRUCT, false}}) {
    SCOPED_TRACE(v1::MigrationMode_Name(mode));
    const std::string move = StartSession(*a);
    ASSERT_TRUE(Generate(*a, move, 4).ok());
    v1::MigrateReply moved;
    ASSERT_TRUE(Migrate(*a, move, *b, mode, &moved).ok());
    v1::ScoreReply there;
    ASSERT_TRUE(score(*b, moved.target_session_id(), false, &ref.top(), &there).ok());
    std::fprintf(stderr, "%s: dNLL %+.5f, KL %.6f, top-1 %.3f\n",
                 v1::MigrationMode_Name(mode).c_str(), there.mean_nll() - ref.mean_nll(),
                 there.mean_kl(), there.top1_agreement());
    if (exact) {
      EXPECT_EQ(there.mean_nll(), ref.mean_nll());
      EXPECT_LT(there.mean_kl(), 1e-6);
      EXPECT_EQ(there.top1_agreement(), 1.0);
    } else {
      EXPECT_NE(there.mean_nll(), ref.mean_nll());
      EXPECT_GT(there.mean_kl(), 1e-6);
      EXPECT_GE(there.top1_agreement(), 0.0);
      EXPECT_LE(there.top1_agreement(), 1.0);
    }
  }
  // Bad references: refused, the session scored on as before.
  auto bad = [&](const char* needle, auto mutate) {
    auto reference = ref.top();
    mutate(reference);
    v1::ScoreReply reply;
    const grpc::Status s = score(*a, stay, false, &reference, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  };
  using Ref = google::protobuf::RepeatedPtrField<v1::TopLogProbs>;
  bad("reference holds 11 positions for 12 token_ids", [](Ref& r) { r.RemoveLast(); });
  bad("reference position 3: reference token -1 is outside the vocabulary",
      [](Ref& r) { r[3].set_token_ids(1, -1); });
  bad("is outside the vocabulary", [&](Ref& r) { r[4].set_token_ids(2, static_cast<int>(vocab)); });
  bad("reference position 0: a reference token is listed twice",
      [](Ref& r) { r[0].set_token_ids(1, r[0].token_ids(0)); });
  bad("reference position 5: 64 reference tokens with 63",
      [](Ref& r) { r[5].mutable_logprobs()->RemoveLast(); });
  bad("is not a finite value <= 0", [](Ref& r) { r[2].set_logprobs(0, 3.0f); });
  bad("not most likely first", [](Ref& r) { r[6].set_logprobs(3, 0.0f); });
  {
    // Top tokens for more positions than a reply can carry: refused before any work.
    grpc::ClientContext ctx;
    v1::ScoreRequest req;
    req.set_session_id(stay);
    for (int i = 0; i < 4097; ++i) req.add_token_ids(i % 500);
    req.set_return_top(true);
    v1::ScoreReply reply;
    const grpc::Status s = a->stub->Score(&ctx, req, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("at most 4096 tokens, not 4097"), std::string::npos)
        << s.error_message();
  }
  EXPECT_EQ(Score(*a, stay, x), ref.mean_nll());
}

// A policy whose ladder holds rungs: the ranking is the tiny policy's two groups in its order,
// and the bank (which holds both) serves int4 with none, one or both rebuilt and int8 with none;
// its own configuration rebuilds both in int4. int8 with one group rebuilt was measured with
// other fits: not a rung.
std::shared_ptr<const Retention> LadderRetention(const std::shared_ptr<const Retention>& r) {
  RetentionPolicy p = r->policy;
  p.wire_form = "int4";
  p.singleton_risks.clear();
  for (const LayerGroup& g : p.rebuilt_groups) p.singleton_risks.push_back({g, {}});
  auto point = [](const char* form, int32_t groups, double sent, double mean, bool in_bank) {
    return RetentionPolicy::PathPoint{.groups = groups,
                                      .delta_nll = {.mean = mean, .requests = 8},
                                      .wire_form = form,
                                      .kv_sent_fraction = sent,
                                      .in_bank = in_bank};
  };
  p.path = {point("int4", 0, 0.30, 0.002, true), point("int4", 1, 0.22, 0.004, true),
            point("int4", 2, 0.15, 0.009, true), point("int8", 0, 0.55, 0.0005, true),
            point("int8", 1, 0.41, 0.001, false)};
  auto made = MakeRetention(std::move(p), r->bank);
  EXPECT_TRUE(made.ok()) << made.status();
  return *made;
}

TEST_F(Nodes, ASessionMigratesAtAnyRungOfThePolicysLadder) {
  const std::shared_ptr<const Retention> ladder = LadderRetention(*retention_);
  ASSERT_EQ(ladder->rungs.size(), 5u);  // int4 k=2,1,0; int8 k=0; exact
  auto with_ladder = [&](NodeOptions& o) { o.retention = ladder; };
  auto a = Start(false, 0, 3e-3, with_ladder), b = Start(false, 0, 3e-3, with_ladder);
  const ModelConfig& c = a->engine->config();
  const int64_t history = 30 + 4 - 1;
  // Migrate `id` from `from` to `to` in `mode`, naming the rung (form, groups).
  auto migrate_at = [](TestNode& from, const std::string& id, const TestNode& to,
                       v1::MigrationMode mode, v1::KvWireForm form, int32_t groups,
                       v1::MigrateReply* reply) {
    grpc::ClientContext ctx;
    v1::MigrateRequest req;
    req.set_session_id(id);
    req.set_target_address(to.address);
    req.set_mode(mode);
    req.set_wire_form(form);
    req.set_rebuilt_groups(groups);
    req.set_allow_fallback(true);
    return from.stub->Migrate(&ctx, req, reply);
  };
  for (const RetentionRung& rung : ladder->rungs) {
    SCOPED_TRACE(RungName(rung.rung));
    const std::string stay = StartSession(*a), move = StartSession(*a);
    ASSERT_TRUE(Generate(*a, stay, 4).ok());
    ASSERT_TRUE(Generate(*a, move, 4).ok());
    v1::MigrateReply reply;
    const grpc::Status s = migrate_at(*a, move, *b, v1::RECONSTRUCT,
                                      WireFormToProto(rung.rung.form), rung.rung.groups, &reply);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(reply.mode(), v1::RECONSTRUCT);
    EXPECT_EQ(reply.wire_form(), WireFormToProto(rung.rung.form));
    EXPECT_EQ(reply.rebuilt_groups(), rung.rung.groups);
    EXPECT_EQ(reply.rung_delta_nll(), rung.rung.delta_nll.mean);
    // Exactly the rung's kept layers went, in its form.
    const auto kept = static_cast<int64_t>(rung.policy.kept_layers.size());
    EXPECT_EQ(kept, c.n_layers - 2 * rung.rung.groups);
    EXPECT_EQ(reply.kv_bytes_sent(),
              StreamKvBytes(rung.rung.form, history, kept, c.n_kv_heads, c.head_dim, DType::kF32));
    EXPECT_EQ(Tokens(*b, reply.target_session_id()), Tokens(*a, stay));
    auto more = Generate(*b, reply.target_session_id(), 6);
    ASSERT_TRUE(more.ok()) << more.status();
    EXPECT_EQ(more->size(), 6u);
  }
  // Unset, the rung is the policy's own configuration.
  const std::string id = StartSession(*a);
  v1::MigrateReply reply;
  grpc::Status s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.rebuilt_groups(), 2);
  EXPECT_EQ(reply.wire_form(), v1::KV_WIRE_INT4);

  // A rung the ladder lacks, and rebuilt_groups outside RECONSTRUCT: refused before anything
  // starts (no fallback runs instead), the session untouched.
  const std::string other = StartSession(*a);
  const std::vector<int32_t> before = Tokens(*a, other);
  for (auto [mode, form, groups, needle] :
       {std::tuple{v1::RECONSTRUCT, v1::KV_WIRE_INT8, 1, "int8 k=1 is not a rung of policy tiny"},
        std::tuple{v1::RECONSTRUCT, v1::KV_WIRE_INT4, 3, "int4 k=3 is not a rung"},
        std::tuple{v1::FULL_KV, v1::KV_WIRE_INT4, 1, "only RECONSTRUCT runs at"}}) {
    s = migrate_at(*a, other, *b, mode, form, groups, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  }
  EXPECT_EQ(Tokens(*a, other), before);

  // A target whose policy (the same version) has no such rung refuses the handshake; the
  // fallback then runs FULL_KV in the named form, and the session moves whole.
  auto plain = Start(false, 0, 3e-3,
                     [&](NodeOptions& o) { o.retention = RetentionIn(*retention_, "int4"); });
  s = migrate_at(*a, other, *plain, v1::RECONSTRUCT, v1::KV_WIRE_INT4, 1, &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::FULL_KV);
  EXPECT_NE(reply.mode_reason().find("reconstruct should send layers"), std::string::npos)
      << reply.mode_reason();
  EXPECT_EQ(Tokens(*plain, reply.target_session_id()), before);

  // A node without a policy has no ladder: a named rung is refused, never run as something else.
  auto bare = Start(false);
  const std::string mine = StartSession(*bare);
  s = migrate_at(*bare, mine, *b, v1::RECONSTRUCT, v1::KV_WIRE_INT4, 1, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("and this node has none"), std::string::npos)
      << s.error_message();
  ASSERT_TRUE(Generate(*bare, mine, 1).ok());
}

TEST_F(Nodes, AHandshakeInAFormThePolicyDoesNotAllowIsRefusedAndCounted) {
  // A follows an int8 policy, B the same version calibrated plain.
  const std::shared_ptr<const Retention> int8 = RetentionIn(*retention_, "int8");
  auto a = Start(false, 0, 3e-3, [&](NodeOptions& o) { o.retention = int8; });
  auto b = Start(true);
  const std::string id = StartSession(*a);
  ASSERT_TRUE(Generate(*a, id, 3).ok());
  const std::vector<int32_t> before = Tokens(*a, id);
  v1::MigrateReply reply;
  grpc::Status s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("wire form int8 is not the plain that policy tiny v3 was "
                                   "calibrated for"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(b->Metrics().find("reason=\"wire_form\",role=\"target\"} 1"), std::string::npos)
      << b->Metrics();
  EXPECT_NE(a->Metrics().find("reason=\"handshake_refused\",role=\"source\"} 1"),
            std::string::npos);
  // Nothing moved: the session is on A as it was, B serves nothing, and both keep serving.
  EXPECT_EQ(Tokens(*a, id), before);
  EXPECT_NE(b->Metrics().find("riskkv_active_sessions{model=\"tiny\"} 0"), std::string::npos);
  ASSERT_TRUE(Generate(*a, id, 2).ok());
  // With fallback the same request runs FULL_KV, in its own (plain) form.
  reply.Clear();
  s = Migrate(*a, id, *b, v1::RECONSTRUCT, &reply, /*fallback=*/true);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(reply.mode(), v1::FULL_KV);
  EXPECT_EQ(reply.wire_form(), v1::KV_WIRE_PLAIN);
  EXPECT_NE(reply.mode_reason().find("wire form int8"), std::string::npos) << reply.mode_reason();
  // A request naming a form this node does not know is refused before anything starts.
  const std::string other = StartSession(*a);
  grpc::ClientContext ctx;
  v1::MigrateRequest req;
  req.set_session_id(other);
  req.set_target_address(b->address);
  req.set_mode(v1::FULL_KV);
  req.set_wire_form(static_cast<v1::KvWireForm>(9));
  s = a->stub->Migrate(&ctx, req, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("wire form 9"), std::string::npos) << s.error_message();
  ASSERT_TRUE(Generate(*a, other, 1).ok());
}

// The node-wide KV budget: a call that would take the node past it is refused before it
// computes anything, the session it was for stays as it was, a receive is refused as soon as its
// stream announces more than fits, and what closes returns to the budget.
TEST_F(Nodes, TheKvBudgetBoundsWhatCallsAndReceivesHold) {
  const ModelConfig c = Model::Load(Path(), {.threads = 1}).value()->config();
  const int64_t row = c.n_layers * 2 * c.n_kv_heads * c.head_dim * 4;  // f32 KV
  auto a = Start(false, 0, 3e-3, [&](NodeOptions& o) { o.kv_budget_bytes = 100 * row; });
  auto b = Start(false, 0, 3e-3, [&](NodeOptions& o) { o.kv_budget_bytes = 40 * row; });
  auto kv_bytes = [](const TestNode& n, const std::string& state) {
    return n.MetricValue("riskkv_kv_bytes{model=\"tiny\",state=\"" + state + "\"}");
  };
  EXPECT_NE(
      a->Metrics().find("riskkv_kv_budget_bytes{model=\"tiny\"} " + std::to_string(100 * row)),
      std::string::npos);

  const std::string s = StartSession(*a);  // 30 tokens
  EXPECT_EQ(kv_bytes(*a, "sessions"), 30.0 * row);
  {
    grpc::ClientContext ctx;
    v1::StartSessionRequest req;
    for (int i = 0; i < 80; ++i) req.add_token_ids(i + 7);
    v1::SessionInfo info;
    const grpc::Status st = a->stub->StartSession(&ctx, req, &info);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
    EXPECT_NE(st.error_message().find("--kv-budget"), std::string::npos) << st.error_message();
  }
  EXPECT_EQ(kv_bytes(*a, "sessions"), 30.0 * row) << "a refused start holds nothing";

  // Generating stops where the next row would pass the budget: 70 decode steps after the
  // prefill's 30 rows, each token sampled from the step before it.
  auto gen = Generate(*a, s, 150);
  ASSERT_FALSE(gen.ok());
  EXPECT_EQ(gen.status().code(), absl::StatusCode::kResourceExhausted) << gen.status();
  EXPECT_EQ(Tokens(*a, s).size(), 30u + 71u);
  EXPECT_EQ(kv_bytes(*a, "sessions"), 100.0 * row);
  {
    grpc::ClientContext ctx;
    v1::ScoreRequest req;
    req.set_session_id(s);
    req.add_token_ids(5);
    v1::ScoreReply reply;
    EXPECT_EQ(a->stub->Score(&ctx, req, &reply).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << "scoring works on a copy, which the budget has no room for";
  }

  // B's budget holds 40 rows: the 101-token session's stream is refused as soon as its handshake
  // announces it; A keeps serving the session.
  v1::MigrateReply reply;
  const grpc::Status moved = Migrate(*a, s, *b, v1::FULL_KV, &reply);
  EXPECT_FALSE(moved.ok());
  EXPECT_NE(moved.error_message().find("KV budget"), std::string::npos) << moved.error_message();
  EXPECT_EQ(Tokens(*a, s).size(), 101u);
  EXPECT_EQ(kv_bytes(*b, "receiving"), 0.0);
  EXPECT_EQ(kv_bytes(*b, "sessions"), 0.0);
  EXPECT_NE(b->Metrics().find("reason=\"kv_budget\",role=\"target\"} 1"), std::string::npos)
      << b->Metrics();

  // Closing returns the rows: the 80-token start that was refused now fits.
  {
    grpc::ClientContext ctx;
    v1::CloseSessionRequest req;
    req.set_session_id(s);
    v1::CloseSessionReply r;
    ASSERT_TRUE(a->stub->CloseSession(&ctx, req, &r).ok());
  }
  EXPECT_EQ(kv_bytes(*a, "sessions"), 0.0);
  // A short session fits B; once received, its rows count as a session's there, and they left A
  // with it.
  const std::string small = StartSession(*a, 0, {5, 6, 7, 8, 9, 10});
  EXPECT_EQ(kv_bytes(*a, "sessions"), 6.0 * row);
  ASSERT_TRUE(Migrate(*a, small, *b, v1::FULL_KV, &reply).ok());
  EXPECT_EQ(kv_bytes(*b, "sessions"), 6.0 * row);  // the same 6 rows as on A
  EXPECT_EQ(kv_bytes(*b, "receiving"), 0.0);
  EXPECT_EQ(kv_bytes(*a, "sessions"), 0.0);
  std::vector<int32_t> long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt.push_back(i + 7);
  StartSession(*a, 0, long_prompt);
  EXPECT_EQ(kv_bytes(*a, "sessions"), 80.0 * row);
}

}  // namespace
}  // namespace riskkv
