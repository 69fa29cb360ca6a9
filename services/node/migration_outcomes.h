// The target's record of how recent incoming migrations ended, by their handshake's migration
// id, so a source whose commit confirmation was lost can ask instead of guessing: a session must
// never end up served by both nodes, nor by neither.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace riskkv {

class MigrationOutcomes {
 public:
  explicit MigrationOutcomes(size_t kept = 4096) : kept_(kept) {}

  // Runs `adopt` (registering the session, giving its id) unless the migration was already
  // asked about, and records the id it gave. FailedPrecondition when it was asked about first.
  absl::StatusOr<std::string> Commit(const std::string& migration_id,
                                     const std::function<absl::StatusOr<std::string>()>& adopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The session's confirmation could not be sent: runs `drop` (unregistering it) and records the
  // migration as not committed, unless its source already asked and was told it committed; then
  // the session stays and false is returned.
  bool Revoke(const std::string& migration_id, const std::function<void()>& drop)
      ABSL_LOCKS_EXCLUDED(mu_);
  // This node cut the migration's stream off before its commit (`why`, in words): recorded as
  // not committed, with the reason its source is told when it asks.
  void CutOff(const std::string& migration_id, std::string why) ABSL_LOCKS_EXCLUDED(mu_);

  struct Answer {
    std::optional<std::string> session;  // the session's id here, when it committed
    std::string failure;                 // when this node cut the stream off: why
  };
  // Whether the migration committed here; when it did not, from now on it never will (a commit
  // arriving later is refused).
  Answer Ask(const std::string& migration_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Outcome {
    std::optional<std::string> session;  // committed: its id; nullopt: given up or revoked
    bool told = false;                   // an Ask reported it
    std::string failure;                 // cut off by this node: why
  };
  Outcome& Record(const std::string& id, std::optional<std::string> session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t kept_;
  absl::Mutex mu_;
  std::map<std::string, Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // oldest first, at most kept_
};

}  // namespace riskkv
