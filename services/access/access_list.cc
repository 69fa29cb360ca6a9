// The access file's format and lookups (see access_list.h).
#include "services/access/access_list.h"

#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace riskkv {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxIdentityLength = 128;

std::optional<Role> RoleFromName(absl::string_view name) {
  if (name == "client") return Role::kClient;
  if (name == "node") return Role::kNode;
  if (name == "operator") return Role::kOperator;
  return std::nullopt;
}

// Equal strings, in time that depends on their lengths only.
bool SameSecret(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool ValidIdentity(absl::string_view id) {
  if (id.empty() || id.size() > kMaxIdentityLength) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '@' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kClient:
      return "client";
    case Role::kNode:
      return "node";
    case Role::kOperator:
      return "operator";
  }
  return "unknown";
}

absl::string_view ActionName(Action action) {
  switch (action) {
    case Action::kUseSessions:
      return "use sessions";
    case Action::kReceiveSessions:
      return "send sessions to this node";
    case Action::kFollowPolicies:
      return "follow policies";
    case Action::kReadPolicies:
      return "read policies";
    case Action::kPutPolicies:
      return "put policies";
  }
  return "unknown";
}

bool Allows(Role role, Action action) {
  if (role == Role::kOperator) return true;
  switch (action) {
    case Action::kUseSessions:
      return role == Role::kClient;
    case Action::kReceiveSessions:
    case Action::kFollowPolicies:
      return role == Role::kNode;
    case Action::kReadPolicies:
      return true;
    case Action::kPutPolicies:
      return false;
  }
  return false;
}

absl::StatusOr<AccessList> AccessList::Parse(absl::string_view text, absl::string_view source) {
  AccessList list;
  std::map<std::string, Role> roles;  // identity -> its role
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    const std::vector<absl::string_view> f =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", why));
    };
    if (f.size() != 4) {
      return bad("expected 'ROLE IDENTITY token SECRET' or 'ROLE IDENTITY san NAME', got " +
                 std::to_string(f.size()) + " fields");
    }
    const std::optional<Role> role = RoleFromName(f[0]);
    if (!role) {
      return bad(absl::StrCat("unknown role '", f[0], "' (client, node or operator)"));
    }
    if (!ValidIdentity(f[1])) {
      return bad(absl::StrCat("identity '", f[1], "' is not 1-", kMaxIdentityLength,
                              " characters of [A-Za-z0-9._@-]"));
    }
    if (f[2] != "token" && f[2] != "san") {
      return bad(absl::StrCat("unknown credential kind '", f[2], "' (token or san)"));
    }
    const bool is_token = f[2] == "token";
    if (is_token && f[3].size() < kMinTokenLength) {
      return bad(absl::StrCat("the token of '", f[1], "' is shorter than ", kMinTokenLength,
                              " characters"));
    }
    const std::string identity(f[1]);
    if (auto it = roles.find(identity); it != roles.end() && it->second != *role) {
      return bad(absl::StrCat("identity '", identity, "' is listed as ", RoleName(it->second),
                              " and as ", RoleName(*role)));
    }
    for (const Entry& e : list.entries_) {
      if (e.is_token == is_token && e.credential == f[3]) {
        return bad(
            absl::StrCat("this ", f[2], " is listed twice (also for '", e.who.identity, "')"));
      }
    }
    roles[identity] = *role;
    list.entries_.push_back({{identity, *role}, is_token, std::string(f[3])});
  }
  return list;
}

std::optional<Principal> AccessList::ByToken(absl::string_view token) const {
  std::optional<Principal> found;
  for (const Entry& e : entries_) {  // every entry compared, a match or not
    if (e.is_token && SameSecret(e.credential, token) && !found) found = e.who;
  }
  return found;
}

std::optional<Role> AccessList::RoleOf(absl::string_view identity) const {
  for (const Entry& e : entries_) {
    if (e.who.identity == identity) return e.who.role;
  }
  return std::nullopt;
}

std::optional<Principal> AccessList::BySan(absl::string_view san) const {
  for (const Entry& e : entries_) {
    if (!e.is_token && e.credential == san) return e.who;
  }
  return std::nullopt;
}

}  // namespace riskkv
