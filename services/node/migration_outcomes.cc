// How incoming migrations ended (see migration_outcomes.h).
#include "services/node/migration_outcomes.h"

namespace riskkv {

absl::StatusOr<std::string> MigrationOutcomes::Commit(
    const std::string& migration_id, const std::function<absl::StatusOr<std::string>()>& adopt) {
  absl::MutexLock lock(&mu_);
  if (outcomes_.count(migration_id) != 0) {
    return absl::FailedPreconditionError("migration " + migration_id +
                                         " was given up by its source before its commit arrived");
  }
  absl::StatusOr<std::string> id = adopt();
  if (id.ok()) Record(migration_id, *id);
  return id;
}

bool MigrationOutcomes::Revoke(const std::string& migration_id, const std::function<void()>& drop) {
  absl::MutexLock lock(&mu_);
  auto it = outcomes_.find(migration_id);
  if (it != outcomes_.end() && it->second.told && it->second.session) return false;
  drop();
  Record(migration_id, std::nullopt);
  return true;
}

void MigrationOutcomes::CutOff(const std::string& migration_id, std::string why) {
  absl::MutexLock lock(&mu_);
  auto it = outcomes_.find(migration_id);
  if (it != outcomes_.end() && it->second.session) return;  // committed before the cut
  Record(migration_id, std::nullopt).failure = std::move(why);
}

MigrationOutcomes::Answer MigrationOutcomes::Ask(const std::string& migration_id) {
  absl::MutexLock lock(&mu_);
  auto it = outcomes_.find(migration_id);
  // Not seen: fenced, so its commit, if it still comes, is refused.
  Outcome& o = it != outcomes_.end() ? it->second : Record(migration_id, std::nullopt);
  o.told = true;
  return {.session = o.session, .failure = o.failure};
}

MigrationOutcomes::Outcome& MigrationOutcomes::Record(const std::string& id,
                                                      std::optional<std::string> session) {
  auto [it, added] = outcomes_.insert_or_assign(
      id, Outcome{.session = std::move(session), .told = false, .failure = ""});
  if (added) order_.push_back(id);
  while (order_.size() > kept_ && order_.front() != id) {
    outcomes_.erase(order_.front());
    order_.pop_front();
  }
  return it->second;
}

}  // namespace riskkv
