// The access file's format: what it accepts, each refusal naming its line, lookups, and which
// role may do what.
#include "services/access/access_list.h"

#include <gtest/gtest.h>

#include <string>

namespace riskkv {
namespace {

constexpr char kFile[] = R"(# role identity credential
client   alice   token  alice-secret-0123456789
client   alice   token  alice-rotated-9876543210   # a second token during a rotation
node     edge-b  token  edge-b-secret-0123456789
operator ops     san    ops.riskkv.internal

)";

TEST(AccessList, ParsesRolesTokensAndNames) {
  auto list = AccessList::Parse(kFile, "access");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->size(), 4u);
  auto alice = list->ByToken("alice-secret-0123456789");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->identity, "alice");
  EXPECT_EQ(alice->role, Role::kClient);
  EXPECT_FALSE(alice->any_session());
  auto rotated = list->ByToken("alice-rotated-9876543210");
  ASSERT_TRUE(rotated.has_value());
  EXPECT_EQ(rotated->identity, "alice");
  auto edge = list->ByToken("edge-b-secret-0123456789");
  ASSERT_TRUE(edge.has_value());
  EXPECT_EQ(edge->role, Role::kNode);
  auto ops = list->BySan("ops.riskkv.internal");
  ASSERT_TRUE(ops.has_value());
  EXPECT_EQ(ops->role, Role::kOperator);
  EXPECT_TRUE(ops->any_session());
}

TEST(AccessList, UnknownCredentialsMatchNothing) {
  auto list = AccessList::Parse(kFile, "access");
  ASSERT_TRUE(list.ok());
  EXPECT_FALSE(list->ByToken("alice-secret-012345678").has_value()) << "a prefix";
  EXPECT_FALSE(list->ByToken("alice-secret-01234567890").has_value()) << "longer";
  EXPECT_FALSE(list->ByToken("").has_value());
  EXPECT_FALSE(list->ByToken("ops.riskkv.internal").has_value()) << "a name is not a token";
  EXPECT_FALSE(list->BySan("alice-secret-0123456789").has_value()) << "a token is not a name";
  EXPECT_FALSE(list->BySan("OPS.riskkv.internal").has_value());
}

TEST(AccessList, RefusesEachMistakeNamingItsLine) {
  const struct {
    const char* text;
    const char* says;
  } cases[] = {
      {"client alice token short", "access:1: the token of 'alice' is shorter than 16"},
      {"\nadmin alice token 0123456789abcdef", "access:2: unknown role 'admin'"},
      {"client al/ice token 0123456789abcdef", "identity 'al/ice' is not"},
      {"client alice password 0123456789abcdef", "unknown credential kind 'password'"},
      {"client alice token", "got 3 fields"},
      {"client alice token 0123456789abcdef extra", "got 5 fields"},
      {"client alice token 0123456789abcdef\nnode bob token 0123456789abcdef",
       "access:2: this token is listed twice (also for 'alice')"},
      {"client alice token 0123456789abcdef\noperator alice token fedcba9876543210",
       "identity 'alice' is listed as client and as operator"},
  };
  for (const auto& c : cases) {
    auto list = AccessList::Parse(c.text, "access");
    ASSERT_FALSE(list.ok()) << c.text;
    EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(list.status().message().find(c.says), std::string::npos)
        << list.status().message() << " should say: " << c.says;
  }
  const std::string long_id(129, 'a');
  EXPECT_FALSE(AccessList::Parse("client " + long_id + " token 0123456789abcdef", "a").ok());
  EXPECT_TRUE(
      AccessList::Parse("client " + long_id.substr(1) + " token 0123456789abcdef", "a").ok());
}

TEST(AccessList, AnEmptyFileAdmitsNobody) {
  auto list = AccessList::Parse("# nobody yet\n\n", "access");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 0u);
  EXPECT_FALSE(list->ByToken("0123456789abcdef").has_value());
}

TEST(AccessList, RolesAllowTheirActionsOnly) {
  // client: its sessions and reading policies; node: sending sessions in and following
  // policies; operator: everything.
  EXPECT_TRUE(Allows(Role::kClient, Action::kUseSessions));
  EXPECT_FALSE(Allows(Role::kClient, Action::kReceiveSessions));
  EXPECT_FALSE(Allows(Role::kClient, Action::kFollowPolicies));
  EXPECT_TRUE(Allows(Role::kClient, Action::kReadPolicies));
  EXPECT_FALSE(Allows(Role::kClient, Action::kPutPolicies));
  EXPECT_FALSE(Allows(Role::kNode, Action::kUseSessions));
  EXPECT_TRUE(Allows(Role::kNode, Action::kReceiveSessions));
  EXPECT_TRUE(Allows(Role::kNode, Action::kFollowPolicies));
  EXPECT_TRUE(Allows(Role::kNode, Action::kReadPolicies));
  EXPECT_FALSE(Allows(Role::kNode, Action::kPutPolicies));
  for (Action a : {Action::kUseSessions, Action::kReceiveSessions, Action::kFollowPolicies,
                   Action::kReadPolicies, Action::kPutPolicies}) {
    EXPECT_TRUE(Allows(Role::kOperator, a)) << ActionName(a);
  }
}

TEST(AccessList, IdentitiesAreOfTheirCharacterSet) {
  EXPECT_TRUE(ValidIdentity("edge-b.site_1@example"));
  EXPECT_FALSE(ValidIdentity(""));
  EXPECT_FALSE(ValidIdentity("two words"));
  EXPECT_FALSE(ValidIdentity("a\nb"));
  EXPECT_FALSE(ValidIdentity(std::string(129, 'x')));
}

}  // namespace
}  // namespace riskkv
