// The node's session table: ids, the limit, exclusive use, listing, withdraw and restore.
#include "services/node/session_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <optional>
#include <set>
#include <thread>

namespace riskkv {
namespace {

std::unique_ptr<NodeSession> WithTokens(std::vector<int32_t> tokens) {
  auto s = std::make_unique<NodeSession>();
  s->tokens = std::move(tokens);
  return s;
}

TEST(SessionTable, GivesDistinctIdsUpToItsLimitAndCountsThem) {
  std::vector<size_t> counts;
  SessionTable table(2, [&](size_t n) { counts.push_back(n); });
  auto a = table.Add(WithTokens({1}));
  auto b = table.Add(WithTokens({2}));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  // 128 random bits each, as 32 hex digits.
  for (const std::string& id : {*a, *b}) {
    EXPECT_EQ(id.size(), 32u) << id;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
  EXPECT_EQ(table.CheckRoom().code(), absl::StatusCode::kResourceExhausted);
  auto c = table.Add(WithTokens({3}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("limit of 2 sessions"), std::string_view::npos);
  table.Erase(*a);
  EXPECT_TRUE(table.CheckRoom().ok());
  EXPECT_EQ(counts, (std::vector<size_t>{1, 2, 1}));
}

// An owner filter shows a caller its own sessions only: another owner's is NotFound in every
// lookup, with the message of an id that never existed, and missing from listings; no filter
// (an operator) sees all.
TEST(SessionTable, AnOwnerFilterHidesOtherOwnersSessions) {
  SessionTable table(4);
  auto mine = WithTokens({1});
  mine->owner = "alice";
  const std::string id = *table.Add(std::move(mine));
  const OwnerFilter alice("alice"), bob("bob");
  EXPECT_TRUE(table.Acquire(id, alice).ok());
  for (const absl::Status& s :
       {table.Acquire(id, bob).status(), table.BeginMigration(id, bob).status(),
        table.Inspect(
            id, [](const NodeSession&) {}, bob)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(s.message(), "no session '" + id + "' on this node");
  }
  auto listed = [&](const OwnerFilter& who) {
    std::vector<std::string> ids;
    table.ForEach([&](const std::string& i, const NodeSession*, bool) { ids.push_back(i); }, who);
    return ids;
  };
  EXPECT_EQ(listed(alice), std::vector<std::string>{id});
  EXPECT_TRUE(listed(bob).empty());
  EXPECT_EQ(listed(std::nullopt), std::vector<std::string>{id});
  // Where it went after a migration is its owner's to learn.
  {
    auto out = table.BeginMigration(id, alice);
    ASSERT_TRUE(out.ok());
    out->Withdraw();
    out->Moved({.target_address = "10.0.0.2:7070", .session_id = "abc"});
  }
  ASSERT_TRUE(table.MovedTo(id, alice).has_value());
  EXPECT_EQ(table.MovedTo(id, alice)->session_id, "abc");
  EXPECT_FALSE(table.MovedTo(id, bob).has_value());
  EXPECT_NE(table.Acquire(id, alice).status().message().find("moved to 10.0.0.2:7070"),
            std::string_view::npos);
  EXPECT_EQ(table.Acquire(id, bob).status().message(), "no session '" + id + "' on this node");
}

// One owner holds at most its own limit; other owners and ownerless sessions are not held back
// by it.
TEST(SessionTable, AnOwnerHoldsAtMostItsLimit) {
  SessionTable table(8, nullptr, /*max_per_owner=*/2);
  auto owned = [](const std::string& owner) {
    auto s = WithTokens({1});
    s->owner = owner;
    return s;
  };
  ASSERT_TRUE(table.Add(owned("alice")).ok());
  ASSERT_TRUE(table.Add(owned("alice")).ok());
  EXPECT_EQ(table.CheckRoom("alice").code(), absl::StatusCode::kResourceExhausted);
  auto third = table.Add(owned("alice"));
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("'alice' holds its limit of 2 sessions"),
            std::string_view::npos)
      << third.status();
  EXPECT_TRUE(table.CheckRoom("bob").ok());
  EXPECT_TRUE(table.Add(owned("bob")).ok());
  EXPECT_TRUE(table.Add(owned("")).ok());
  EXPECT_TRUE(table.Add(owned("")).ok());
  EXPECT_TRUE(table.Add(owned("")).ok());
  EXPECT_EQ(table.size(), 6u);
}

TEST(SessionTable, OneCallAtATimeUsesASession) {
  SessionTable table(4);
  const std::string id = *table.Add(WithTokens({5, 6}));
  EXPECT_EQ(table.Acquire("nope").status().code(), absl::StatusCode::kNotFound);
  {
    auto lease = table.Acquire(id);
    ASSERT_TRUE(lease.ok());
    EXPECT_EQ(lease->session().tokens, (std::vector<int32_t>{5, 6}));
    EXPECT_EQ(table.Acquire(id).status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(table.Inspect(id, [](const NodeSession&) {}).code(),
              absl::StatusCode::kFailedPrecondition);
    int busy = 0;
    table.ForEach([&](const std::string&, const NodeSession* s, bool) { busy += s == nullptr; });
    EXPECT_EQ(busy, 1);
    lease->session().tokens.push_back(7);
  }
  std::vector<int32_t> seen;
  ASSERT_TRUE(table.Inspect(id, [&](const NodeSession& s) { seen = s.tokens; }).ok());
  EXPECT_EQ(seen, (std::vector<int32_t>{5, 6, 7}));
}

TEST(SessionTable, AWithdrawnSessionComesBackUnderItsIdOrIsGone) {
  SessionTable table(4);
  const std::string id = *table.Add(WithTokens({1}));
  {
    auto lease = table.Acquire(id);
    ASSERT_TRUE(lease.ok());
    lease->Withdraw();
    EXPECT_EQ(table.size(), 0u);
    EXPECT_EQ(table.Inspect(id, [](const NodeSession&) {}).code(), absl::StatusCode::kNotFound);
    lease->Restore();
    EXPECT_EQ(table.size(), 1u);
  }
  EXPECT_TRUE(table.Acquire(id).ok()) << "restored and released";
  {
    auto lease = table.Acquire(id);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(lease->Remove().ok());
  }
  EXPECT_EQ(table.Acquire(id).status().code(), absl::StatusCode::kNotFound);
}

TEST(SessionTable, ListsEverySessionInIdOrder) {
  SessionTable table(8);
  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.insert(*table.Add(WithTokens({i})));
  std::vector<std::string> listed;
  table.ForEach([&](const std::string& id, const NodeSession* s, bool) {
    EXPECT_NE(s, nullptr);
    listed.push_back(id);
  });
  EXPECT_EQ(listed, std::vector<std::string>(ids.begin(), ids.end()));
}

TEST(SessionTable, OneMigrationAtATimeHoldsASessionAndCloseWaitsForIt) {
  SessionTable table(4);
  const std::string id = *table.Add(WithTokens({1, 2}));
  auto out = table.BeginMigration(id);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(table.BeginMigration(id).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.BeginMigration("nope").status().code(), absl::StatusCode::kNotFound);
  bool migrating = false;
  table.ForEach([&](const std::string&, const NodeSession* s, bool m) {
    EXPECT_NE(s, nullptr) << "a copied session still serves";
    migrating = m;
  });
  EXPECT_TRUE(migrating);
  {
    auto lease = table.Acquire(id);
    ASSERT_TRUE(lease.ok()) << "calls use the session while a migration copies it";
    lease->Publish([](NodeSession& s) { s.tokens.push_back(3); });
    const absl::Status closed = lease->Remove();
    EXPECT_EQ(closed.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(closed.message().find("migrating"), std::string_view::npos);
    EXPECT_FALSE(lease->Yield().has_value()) << "nobody waits to pause it";
  }
  std::vector<int32_t> tokens;
  std::optional<Sampler> sampler;
  out->Snapshot(&tokens, &sampler);
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 2, 3}));
}

TEST(SessionTable, APauseWaitsForTheCallToYieldAndAMoveEndsIt) {
  SessionTable table(4);
  const std::string id = *table.Add(WithTokens({1}));
  auto lease = table.Acquire(id);
  ASSERT_TRUE(lease.ok());
  auto begun = table.BeginMigration(id);
  ASSERT_TRUE(begun.ok());
  std::optional<SessionTable::Outbound> out(std::move(*begun));
  // The generating call's side: tokens until the migration asks, then the outcome.
  std::optional<SessionMoved> where;
  std::thread call([&] {
    for (int i = 0; i < 100000 && !where; ++i) {
      where = lease->Yield();
      if (!where) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  ASSERT_TRUE(out->Pause(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_TRUE(out->paused());
  EXPECT_EQ(table.Inspect(id, [](const NodeSession&) {}).code(),
            absl::StatusCode::kFailedPrecondition)
      << "paused: in the migration's hands";
  // A call arriving during the pause waits for the outcome, or finds the session gone.
  auto late = std::async(std::launch::async, [&] { return table.Acquire(id).status(); });
  out->Withdraw();
  out->Moved({.target_address = "10.0.0.2:7070", .session_id = "b-1"});
  out.reset();  // the hold ends
  call.join();
  ASSERT_TRUE(where.has_value());
  EXPECT_EQ(where->target_address, "10.0.0.2:7070");
  EXPECT_EQ(where->session_id, "b-1");
  EXPECT_EQ(late.get().code(), absl::StatusCode::kNotFound);
  const absl::Status st = table.Acquire(id).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(st.message().find("moved to 10.0.0.2:7070 as 'b-1'"), std::string_view::npos) << st;
  ASSERT_TRUE(table.MovedTo(id).has_value());
  EXPECT_EQ(table.MovedTo(id)->session_id, "b-1");
  EXPECT_EQ(table.size(), 0u);
}

TEST(SessionTable, AMigrationWaitsForAGrowingSessionUntilItStopsGrowing) {
  SessionTable table(4);
  const std::string id = *table.Add(WithTokens({1, 2, 3}));
  auto lease = table.Acquire(id);
  ASSERT_TRUE(lease.ok());
  auto out = table.BeginMigration(id);
  ASSERT_TRUE(out.ok());
  const absl::Time far = absl::Now() + absl::Seconds(60);
  EXPECT_EQ(out->AwaitHistory(2, absl::Seconds(10), far), 2) << "already there";
  // A call publishing a token every 2 ms: the wait ends when the history reaches 12.
  std::atomic<bool> stop{false};
  std::thread call([&] {
    for (int t = 4; !stop.load() && t < 40; ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      lease->Publish([t](NodeSession& s) { s.tokens.push_back(t); });
    }
  });
  EXPECT_GE(out->AwaitHistory(12, absl::Seconds(10), far), 12);
  stop = true;
  call.join();
  // Nothing generating: the wait ends after the gap, not at the deadline.
  const int64_t now = out->history_tokens();
  const absl::Time start = absl::Now();
  EXPECT_EQ(out->AwaitHistory(now + 5, absl::Milliseconds(50), far), now);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
}

TEST(SessionTable, SessionsIdlePastTheTtlExpireButNotOnesInUse) {
  std::vector<size_t> counts;
  SessionTable table(8, [&](size_t n) { counts.push_back(n); });
  const std::string idle = *table.Add(WithTokens({1})), used = *table.Add(WithTokens({2})),
                    moving = *table.Add(WithTokens({3}));
  auto leased = table.Acquire(used);
  ASSERT_TRUE(leased.ok());
  std::optional<SessionTable::Lease> lease(std::move(*leased));
  auto begun = table.BeginMigration(moving);
  ASSERT_TRUE(begun.ok());
  std::optional<SessionTable::Outbound> out(std::move(*begun));
  const absl::Time later = absl::Now() + absl::Minutes(10);
  EXPECT_TRUE(table.ExpireIdle(later, absl::Minutes(20)).empty()) << "within the TTL";
  const std::vector<SessionTable::Expired> gone = table.ExpireIdle(later, absl::Minutes(5));
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].id, idle);
  EXPECT_GE(gone[0].idle, absl::Minutes(10));
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(counts.back(), 2u);
  EXPECT_EQ(table.Acquire(idle).status().code(), absl::StatusCode::kNotFound);
  // Once their use ends, the clock starts again from then.
  lease.reset();
  out.reset();
  EXPECT_TRUE(table.ExpireIdle(absl::Now() + absl::Minutes(4), absl::Minutes(5)).empty());
  EXPECT_EQ(table.ExpireIdle(absl::Now() + absl::Minutes(6), absl::Minutes(5)).size(), 2u);
  EXPECT_EQ(table.size(), 0u);
}

TEST(SessionTable, AFailedMigrationGivesThePausedSessionBack) {
  SessionTable table(4);
  const std::string id = *table.Add(WithTokens({1}));
  auto lease = table.Acquire(id);
  ASSERT_TRUE(lease.ok());
  auto out = table.BeginMigration(id);
  ASSERT_TRUE(out.ok());
  std::atomic<bool> done{false};
  std::atomic<int> moved{0};
  std::thread call([&] {
    while (!done) {
      if (lease->Yield().has_value()) ++moved;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  ASSERT_TRUE(out->Pause(absl::Now() + absl::Seconds(10)).ok());
  out->Withdraw();
  out->Restore();  // the target did not confirm
  out->Unpause();
  done = true;
  call.join();
  EXPECT_EQ(moved.load(), 0);
  EXPECT_EQ(table.size(), 1u);
  EXPECT_FALSE(table.MovedTo(id).has_value());
  // The call holds the session again: a pause now gives up at its deadline.
  EXPECT_EQ(out->Pause(absl::Now() + absl::Milliseconds(20)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace riskkv
