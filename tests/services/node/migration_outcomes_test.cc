// The target's record of how migrations ended: a commit is recorded, a question fences a commit
// still to come, and a session whose source was told it moved is never dropped.
#include "services/node/migration_outcomes.h"

#include <gtest/gtest.h>

namespace riskkv {
namespace {

TEST(MigrationOutcomes, ACommitIsRecordedAndTold) {
  MigrationOutcomes o;
  int adopted = 0;
  auto r = o.Commit("aa", [&]() -> absl::StatusOr<std::string> {
    ++adopted;
    return std::string("s1");
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(adopted, 1);
  EXPECT_EQ(o.Ask("aa").session, std::optional<std::string>("s1"));
  // Told it committed: the session is not dropped when its confirmation cannot be sent.
  bool dropped = false;
  EXPECT_FALSE(o.Revoke("aa", [&] { dropped = true; }));
  EXPECT_FALSE(dropped);
  EXPECT_EQ(o.Ask("aa").session, std::optional<std::string>("s1"));
}

TEST(MigrationOutcomes, AQuestionBeforeTheCommitFencesIt) {
  MigrationOutcomes o;
  EXPECT_EQ(o.Ask("bb").session, std::nullopt);
  bool adopted = false;
  auto r = o.Commit("bb", [&]() -> absl::StatusOr<std::string> {
    adopted = true;
    return std::string("s2");
  });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("given up by its source"), std::string_view::npos);
  EXPECT_FALSE(adopted);
  EXPECT_EQ(o.Ask("bb").session, std::nullopt);
}

TEST(MigrationOutcomes, ARevokedCommitIsNotCommittedAndAFailedAdoptIsNotRecorded) {
  MigrationOutcomes o;
  ASSERT_TRUE(o.Commit("cc", [] { return absl::StatusOr<std::string>("s3"); }).ok());
  bool dropped = false;
  EXPECT_TRUE(o.Revoke("cc", [&] { dropped = true; }));
  EXPECT_TRUE(dropped);
  EXPECT_EQ(o.Ask("cc").session, std::nullopt);
  auto full = o.Commit(
      "dd", [] { return absl::StatusOr<std::string>(absl::ResourceExhaustedError("full")); });
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(o.Ask("dd").session, std::nullopt);
}

TEST(MigrationOutcomes, ACutOffIsToldWithItsReasonAndFencesTheCommit) {
  MigrationOutcomes o;
  o.CutOff("ee", "the source sent nothing for 10 s");
  const MigrationOutcomes::Answer a = o.Ask("ee");
  EXPECT_EQ(a.session, std::nullopt);
  EXPECT_EQ(a.failure, "the source sent nothing for 10 s");
  EXPECT_EQ(o.Commit("ee", [] { return absl::StatusOr<std::string>("s5"); }).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A migration that committed before the cut stays committed.
  ASSERT_TRUE(o.Commit("ff", [] { return absl::StatusOr<std::string>("s6"); }).ok());
  o.CutOff("ff", "late");
  EXPECT_EQ(o.Ask("ff").session, std::optional<std::string>("s6"));
  EXPECT_EQ(o.Ask("ff").failure, "");
  // Never cut off: no reason.
  EXPECT_EQ(o.Ask("gg").failure, "");
}

TEST(MigrationOutcomes, KeepsABoundedNumberOfOutcomes) {
  MigrationOutcomes o(3);
  for (const char* id : {"01", "02", "03", "04"}) {
    ASSERT_TRUE(
        o.Commit(id, [&] { return absl::StatusOr<std::string>(std::string("s") + id); }).ok());
  }
  EXPECT_EQ(o.Ask("04").session, std::optional<std::string>("s04"));
  EXPECT_EQ(o.Ask("02").session, std::optional<std::string>("s02"));
  EXPECT_EQ(o.Ask("01").session, std::nullopt) << "the oldest was forgotten";
}

}  // namespace
}  // namespace riskkv
