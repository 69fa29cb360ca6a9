// The node's session table: ids, the limit, exclusive use, listing, withdraw and restore.
#include "services/node/session_table.h"

#include <gtest/gtest.h>

#include <set>

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
  EXPECT_EQ(a->substr(0, 7), b->substr(0, 7)) << "one random prefix per process";
  EXPECT_EQ(table.CheckRoom().code(), absl::StatusCode::kResourceExhausted);
  auto c = table.Add(WithTokens({3}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("limit of 2 sessions"), std::string_view::npos);
  table.Erase(*a);
  EXPECT_TRUE(table.CheckRoom().ok());
  EXPECT_EQ(counts, (std::vector<size_t>{1, 2, 1}));
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

}  // namespace
}  // namespace riskkv
