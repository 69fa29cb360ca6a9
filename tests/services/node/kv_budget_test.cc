#include "services/node/kv_budget.h"

#include <gtest/gtest.h>

#include <map>
#include <utility>

namespace riskkv {
namespace {

using State = KvBudget::State;

TEST(KvBudget, ChargesGrowWithinTheLimitAndReturnWhenDestroyed) {
  std::map<State, int64_t> seen;
  KvBudget budget(1000, 10, [&](State s, int64_t bytes) { seen[s] = bytes; });
  {
    KvBudget::Charge a = budget.Open(State::kSessions);
    ASSERT_TRUE(a.GrowTo(60).ok());
    EXPECT_TRUE(a.GrowTo(20).ok());  // never shrinks
    EXPECT_EQ(a.rows(), 60);
    KvBudget::Charge b = budget.Open(State::kReceiving);
    ASSERT_TRUE(b.GrowTo(40).ok());  // exactly the limit
    EXPECT_EQ(budget.used_bytes(State::kSessions), 600);
    EXPECT_EQ(budget.used_bytes(State::kReceiving), 400);
    EXPECT_EQ(seen[State::kReceiving], 400);

    const absl::Status over = b.GrowTo(41);
    EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(over.message().find("--kv-budget 1000 bytes"), std::string::npos) << over;
    EXPECT_NE(over.message().find("600 by sessions, 400 by receives"), std::string::npos) << over;
    EXPECT_EQ(b.rows(), 40) << "a refused charge stays as it was";

    // A receive that became a session keeps its rows, under the other state.
    b.MoveTo(State::kSessions);
    EXPECT_EQ(budget.used_bytes(State::kSessions), 1000);
    EXPECT_EQ(budget.used_bytes(State::kReceiving), 0);
    EXPECT_EQ(seen[State::kSessions], 1000);

    KvBudget::Charge moved = std::move(a);
    EXPECT_EQ(moved.rows(), 60);
    EXPECT_EQ(budget.used_bytes(State::kSessions), 1000);
  }
  EXPECT_EQ(budget.used_bytes(State::kSessions), 0);
  EXPECT_EQ(budget.used_bytes(State::kReceiving), 0);
  EXPECT_EQ(seen[State::kSessions], 0);
}

TEST(KvBudget, NoLimitStillCounts) {
  KvBudget budget(0, 7);
  KvBudget::Charge a = budget.Open(State::kSessions);
  ASSERT_TRUE(a.GrowTo(1 << 20).ok());
  EXPECT_EQ(budget.used_bytes(State::kSessions), 7 << 20);
  KvBudget::Charge none;  // not opened on any budget: charges nothing
  EXPECT_TRUE(none.GrowTo(5).ok());
}

TEST(ParseByteSize, ReadsBytesAndUnits) {
  EXPECT_EQ(*ParseByteSize("kv-budget", "0"), 0);
  EXPECT_EQ(*ParseByteSize("kv-budget", "2147483648"), 2147483648LL);
  EXPECT_EQ(*ParseByteSize("kv-budget", "512MiB"), 512LL << 20);
  EXPECT_EQ(*ParseByteSize("kv-budget", "2GiB"), 2LL << 30);
  EXPECT_EQ(*ParseByteSize("kv-budget", "1.5GB"), 1500000000LL);
  EXPECT_EQ(*ParseByteSize("kv-budget", "64 KB"), 64000);
  EXPECT_EQ(*ParseByteSize("kv-budget", "100B"), 100);
  for (const char* bad : {"", "-1", "2 GiBs", "GiB", "1e9", "1.2.3", "12xb", "99999999999TiB"}) {
    const auto r = ParseByteSize("kv-budget", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("--kv-budget '" + std::string(bad) + "'"),
              std::string::npos)
        << r.status();
  }
}

}  // namespace
}  // namespace riskkv
