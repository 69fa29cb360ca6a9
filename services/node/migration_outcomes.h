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
  // The session's id when the migration committed here; nullopt when it did not, and from now
  // on never will (a commit arriving later is refused).
  std::optional<std::string> Ask(const std::string& migration_id) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Outcome {
    std::optional<std::string> session;  // committed: its id; nullopt: given up or revoked
    bool told = false;                   // an Ask reported it
  };
  Outcome& Record(const std::string& id, std::optional<std::string> session)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t kept_;
  absl::Mutex mu_;
  std::map<std::string, Outcome> outcomes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> order_ ABSL_GUARDED_BY(mu_);  // oldest first, at most kept_
};

}  // namespace riskkv
