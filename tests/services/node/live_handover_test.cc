// Live hand-over between nodes over real gRPC: a session that is generating migrates while its
// Generate stream goes on, the stream follows it to the target, and the caller's tokens are
// those of a session that never moved; a target that dies anywhere in the pre-copy, a cancelled
// migration and a generator faster than the link cost the session nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/client/follow_generate.h"
#include "tests/services/node/node_fixture.h"

namespace riskkv {
namespace {

// Every token of one request as a client that follows a moved session sees them.
struct Followed {
  std::vector<int32_t> tokens;
  int hops = 0;  // moves followed
  grpc::Status status;
};

class LiveHandOver : public Nodes {
 protected:
  // Generates `count` tokens in session `id` on `n`, following the session wherever it moves;
  // `seen` counts the tokens as they arrive.
  static Followed GenerateFollowing(TestNode& n, const std::string& id, int count,
                                    std::atomic<int>* seen) {
    Followed out;
    const FollowResult r =
        riskkv::GenerateFollowing(n.address, id, count, {}, [&](const v1::GenerateReply& t, int) {
          out.tokens.push_back(t.token_id());
          ++*seen;
        });
    out.status = r.status;
    out.hops = r.moves;
    return out;
  }

  static grpc::Status MigrateLive(TestNode& from, const std::string& id, const TestNode& to,
                                  v1::MigrationMode mode, v1::MigrateReply* reply,
                                  std::optional<bool> live = true,
                                  grpc::ClientContext* context = nullptr) {
    grpc::ClientContext own;
    grpc::ClientContext* ctx = context ? context : &own;
    v1::MigrateRequest req;
    req.set_session_id(id);
    req.set_target_address(to.address);
    req.set_mode(mode);
    req.set_timeout_seconds(30);
    if (live) req.set_live(*live);
    return from.stub->Migrate(ctx, req, reply);
  }

  static void WaitFor(const std::atomic<int>& seen, int at_least) {
    for (int i = 0; i < 5000 && seen.load() < at_least; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GE(seen.load(), at_least);
  }

  // Room for a 100-token history and 100 generated tokens.
  static void Longer(NodeOptions& o) { o.capacity = 256; }
  static std::vector<int32_t> Prompt(int n) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((i * 31 + 5) % 500);
    return p;
  }

  // A generator that takes `ms` per token, so a migration meets it mid-stream.
  static std::function<void(NodeOptions&)> Paced(int ms,
                                                 std::function<void(NodeOptions&)> more = nullptr) {
    return [ms, more](NodeOptions& o) {
      o.generate_step = [ms] { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
      if (more) more(o);
    };
  }
};

TEST_F(LiveHandOver, AGeneratingSessionMovesMidStreamAndTheCallerLosesNoToken) {
  auto a = Start(true, 0, 3e-3, Paced(2)), b = Start(true), ref = Start(true);
  const int n = 120;
  for (auto mode : {v1::FULL_KV, v1::TOKEN_REPLAY, v1::RECONSTRUCT}) {
    for (float temperature : {0.0f, 0.9f}) {
      SCOPED_TRACE(absl::StrCat(v1::MigrationMode_Name(mode), " at temperature ", temperature));
      auto expect = Generate(*ref, StartSession(*ref, temperature), n);
      ASSERT_TRUE(expect.ok());
      const std::string id = StartSession(*a, temperature);
      std::atomic<int> seen{0};
      auto stream =
          std::async(std::launch::async, [&] { return GenerateFollowing(*a, id, n, &seen); });
      WaitFor(seen, 10);
      v1::MigrateReply reply;
      const grpc::Status st = MigrateLive(*a, id, *b, mode, &reply);
      ASSERT_TRUE(st.ok()) << st.error_message();
      const Followed got = stream.get();
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_EQ(got.hops, 1) << "the stream followed its session to B";
      ASSERT_EQ(static_cast<int>(got.tokens.size()), n);
      // FULL_KV and TOKEN_REPLAY are exact: the tokens are the unmoved session's, in order.
      if (mode != v1::RECONSTRUCT) {
        EXPECT_EQ(got.tokens, *expect);
      }
      EXPECT_TRUE(reply.live());
      EXPECT_GE(reply.precopy_rounds(), 1);
      EXPECT_GT(reply.downtime_seconds(), 0.0);
      EXPECT_LT(reply.downtime_seconds(), reply.total_seconds());
      EXPECT_GE(reply.history_tokens(), 30 + 10);
      if (mode != v1::TOKEN_REPLAY) {
        EXPECT_GT(reply.kv_bytes_before_pause(), 0);
        EXPECT_EQ(reply.kv_bytes_before_pause() + reply.kv_bytes_after_pause(),
                  reply.kv_bytes_sent());
      }
    }
  }
  const std::string m = a->Metrics();
  for (const char* mode : {"full_kv", "token_replay", "reconstruct"}) {
    EXPECT_NE(
        m.find(absl::StrCat("riskkv_migration_downtime_seconds_count{handover=\"live\",mode=\"",
                            mode, "\",model=\"tiny\"} 2")),
        std::string::npos)
        << mode << "\n"
        << m;
  }
}

TEST_F(LiveHandOver, AQuantizedLivePauseComesJustAfterATokenGroupEnds) {
  // int8 rounds end on whole 32-token groups. A generating session is let reach the next group's
  // end before the pause, which then sends only the rows made during that round: without it, a
  // pause at 40-odd rows would leave the 8 or more rows past 32 to the downtime.
  auto a = Start(true, 0, 3e-3, Paced(40)), b = Start(true);
  const std::string id = StartSession(*a);  // 30 tokens
  std::atomic<int> seen{0};
  auto stream =
      std::async(std::launch::async, [&] { return GenerateFollowing(*a, id, 80, &seen); });
  WaitFor(seen, 12);
  grpc::ClientContext ctx;
  v1::MigrateRequest req;
  req.set_session_id(id);
  req.set_target_address(b->address);
  req.set_mode(v1::FULL_KV);
  req.set_wire_form(v1::KV_WIRE_INT8);
  req.set_live(true);
  req.set_timeout_seconds(60);
  v1::MigrateReply reply;
  const grpc::Status st = a->stub->Migrate(&ctx, req, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const Followed got = stream.get();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.hops, 1);
  EXPECT_EQ(static_cast<int>(got.tokens.size()), 80);
  EXPECT_GE(reply.history_tokens(), 64);
  EXPECT_LE(reply.history_tokens() % 32, 4) << reply.ShortDebugString();
  EXPECT_GE(reply.precopy_rounds(), 2);
}

TEST_F(LiveHandOver, AStopAndCopyMigrationOfAGeneratingSessionFollowsToo) {
  auto a = Start(true, 0, 3e-3, Paced(2)), b = Start(true), ref = Start(true);
  const int n = 80;
  auto expect = Generate(*ref, StartSession(*ref), n);
  ASSERT_TRUE(expect.ok());
  const std::string id = StartSession(*a);
  std::atomic<int> seen{0};
  auto stream = std::async(std::launch::async, [&] { return GenerateFollowing(*a, id, n, &seen); });
  WaitFor(seen, 10);
  v1::MigrateReply reply;
  const grpc::Status st = MigrateLive(*a, id, *b, v1::FULL_KV, &reply, false);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const Followed got = stream.get();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.hops, 1);
  EXPECT_EQ(got.tokens, *expect);
  EXPECT_FALSE(reply.live());
  EXPECT_EQ(reply.precopy_rounds(), 0);
  EXPECT_EQ(reply.kv_bytes_before_pause(), 0);
  // Paused for the whole transfer.
  EXPECT_GE(reply.downtime_seconds(), reply.transfer_seconds());
}

TEST_F(LiveHandOver, ATargetDyingAnywhereInThePrecopyCostsTheSessionNothing) {
  // A 100-token history at 2 Mbit/s: the first round's 200 KB take ~0.55 s past the limiter's
  // 64 KB burst, and the rounds after it longer; the target dies at 12 points within.
  auto a = Start(true, 2, 3e-3, Paced(2, Longer)), ref = Start(true, 0, 3e-3, Longer);
  const int n = 100;
  auto expect = Generate(*ref, StartSession(*ref, 0, Prompt(100)), n);
  ASSERT_TRUE(expect.ok());
  for (int point = 0; point < 12; ++point) {
    SCOPED_TRACE(absl::StrCat("target dies ", point * 40, " ms into the migration"));
    auto b = Start(true, 0, 3e-3, Longer);
    const std::string id = StartSession(*a, 0, Prompt(100));
    std::atomic<int> seen{0};
    auto stream =
        std::async(std::launch::async, [&] { return GenerateFollowing(*a, id, n, &seen); });
    WaitFor(seen, 3);
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(40 * point));
      b->server->Shutdown(std::chrono::system_clock::now());
    });
    v1::MigrateReply reply;
    const grpc::Status st = MigrateLive(*a, id, *b, v1::FULL_KV, &reply);
    killer.join();
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.error_message().find("stays on this node"), std::string::npos)
        << st.error_message();
    const Followed got = stream.get();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.hops, 0);
    EXPECT_EQ(got.tokens, *expect) << "the stream went on, uninterrupted, on the source";
    auto more = Generate(*a, id, 1);
    EXPECT_TRUE(more.ok()) << "the session still serves on the source";
  }
}

TEST_F(LiveHandOver, TheRoundCapHandsOverAGeneratorFasterThanTheLink) {
  // A token every millisecond or so, and a pause only when a round finds nothing new
  // (pause_rows 0): the rounds chase the generator until the cap of 3 brings the pause (or, on a
  // slow build, a round outpaces a token). live_migration_test pins the cap's count exactly.
  auto a = Start(true, 8, 3e-3,
                 Paced(1,
                       [](NodeOptions&o) {
                         o.live_max_rounds = 3;
                         o.live_pause_rows = 0;
                       })),
       b = Start(true), ref = Start(true);
  const std::vector<int32_t> prompt = {5, 36, 67, 98};
  const int n = 150;
  auto expect = Generate(*ref, StartSession(*ref, 0, prompt), n);
  ASSERT_TRUE(expect.ok());
  const std::string id = StartSession(*a, 0, prompt);
  std::atomic<int> seen{0};
  auto stream = std::async(std::launch::async, [&] { return GenerateFollowing(*a, id, n, &seen); });
  WaitFor(seen, 2);
  v1::MigrateReply reply;
  const grpc::Status st = MigrateLive(*a, id, *b, v1::FULL_KV, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_GE(reply.precopy_rounds(), 1);
  EXPECT_LE(reply.precopy_rounds(), 3);
  const Followed got = stream.get();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.hops, 1);
  EXPECT_EQ(got.tokens, *expect);
}

TEST_F(LiveHandOver, DuringThePrecopyTheSessionScoresAndCannotBeClosed) {
  // A 100-token history at 1 Mbit/s: the pre-copy lasts about a second.
  auto a = Start(true, 1, 3e-3, Longer), b = Start(true, 0, 3e-3, Longer);
  const std::string id = StartSession(*a, 0, Prompt(100));
  const std::vector<int32_t> probe = {7, 8, 9, 10};
  const double before = Score(*a, id, probe);
  auto migration = std::async(std::launch::async, [&] {
    v1::MigrateReply reply;
    return MigrateLive(*a, id, *b, v1::FULL_KV, &reply);
  });
  bool migrating = false;
  for (int i = 0; i < 1000 && !migrating; ++i) {
    grpc::ClientContext ctx;
    v1::ListSessionsReply list;
    ASSERT_TRUE(a->stub->ListSessions(&ctx, {}, &list).ok());
    migrating = list.sessions_size() == 1 && list.sessions(0).migrating();
    if (!migrating) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(migrating);
  grpc::ClientContext ctx;
  v1::CloseSessionRequest req;
  req.set_session_id(id);
  v1::CloseSessionReply r;
  const grpc::Status closed = a->stub->CloseSession(&ctx, req, &r);
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << closed.error_message();
  EXPECT_NE(closed.error_message().find("migrating"), std::string::npos);
  EXPECT_EQ(Score(*a, id, probe), before) << "Score serves during the pre-copy";
  const grpc::Status st = migration.get();
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST_F(LiveHandOver, ACancelledLiveMigrationStopsAndLeavesNothingOnTheTarget) {
  auto a = Start(true, 1, 3e-3, Paced(2, Longer)), b = Start(true, 0, 3e-3, Longer),
       ref = Start(true, 0, 3e-3, Longer);
  const int n = 100;
  auto expect = Generate(*ref, StartSession(*ref, 0, Prompt(100)), n);
  ASSERT_TRUE(expect.ok());
  const std::string id = StartSession(*a, 0, Prompt(100));
  std::atomic<int> seen{0};
  auto stream = std::async(std::launch::async, [&] { return GenerateFollowing(*a, id, n, &seen); });
  WaitFor(seen, 3);
  grpc::ClientContext ctx;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ctx.TryCancel();
  });
  v1::MigrateReply reply;
  const grpc::Status st = MigrateLive(*a, id, *b, v1::FULL_KV, &reply, true, &ctx);
  canceller.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED) << st.error_message();
  const Followed got = stream.get();
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.hops, 0);
  EXPECT_EQ(got.tokens, *expect);
  // The target's stream was cut: nothing is registered there, and it counted the cut.
  bool counted = false;
  for (int i = 0; i < 1000 && !counted; ++i) {
    counted = b->Metrics().find("role=\"target\"") != std::string::npos;
    if (!counted) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(counted) << b->Metrics();
  grpc::ClientContext c;
  v1::ListSessionsReply list;
  ASSERT_TRUE(b->stub->ListSessions(&c, {}, &list).ok());
  EXPECT_EQ(list.sessions_size(), 0);
}

TEST_F(LiveHandOver, AutoGoesLiveWhenItsEstimateExceedsTheThreshold) {
  for (double threshold : {0.0, 1e9}) {
    SCOPED_TRACE(absl::StrCat("threshold ", threshold));
    auto a = Start(true, 0, 3e-3, [&](NodeOptions& o) { o.live_threshold_seconds = threshold; });
    auto b = Start(true);
    const std::string id = StartSession(*a);
    v1::MigrateReply reply;
    const grpc::Status st = MigrateLive(*a, id, *b, v1::AUTO, &reply, std::nullopt);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(reply.live(), threshold == 0.0);
    EXPECT_EQ(reply.mode_reason().find("live") != std::string::npos, threshold == 0.0)
        << reply.mode_reason();
  }
}

}  // namespace
}  // namespace riskkv
