// The node's sessions (see session_table.h).
#include "services/node/session_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/random_id.h"
#include "common/base/status_macros.h"

namespace riskkv {

SessionTable::SessionTable(int max_sessions, std::function<void(size_t)> on_count,
                           int max_per_owner, std::function<bool(const std::string&)> limited)
    : max_sessions_(max_sessions),
      max_per_owner_(max_per_owner),
      limited_(std::move(limited)),
      on_count_(std::move(on_count)) {}

absl::Status SessionTable::Full() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("this node serves its limit of ", max_sessions_, " sessions"));
}

bool SessionTable::Limited(const std::string& owner) const {
  return !owner.empty() && max_per_owner_ > 0 && (!limited_ || limited_(owner));
}

absl::Status SessionTable::Room(const std::string& owner, bool limited) const {
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return Full();
  if (!limited) return absl::OkStatus();
  int held = 0;
  for (const auto& [id, entry] : sessions_) held += entry->owner == owner;
  if (held >= max_per_owner_) {
    return absl::ResourceExhaustedError(absl::StrCat("'", owner, "' holds its limit of ",
                                                     max_per_owner_, " sessions on this node"));
  }
  return absl::OkStatus();
}

absl::Status SessionTable::CheckRoom(const std::string& owner) const {
  const bool limited = Limited(owner);
  absl::MutexLock lock(&mu_);
  return Room(owner, limited);
}

absl::StatusOr<std::string> SessionTable::Add(std::unique_ptr<NodeSession> session) {
  auto entry = std::make_shared<Entry>();
  entry->owner = session->owner;
  entry->session = std::move(session);
  const bool limited = Limited(entry->owner);  // may read the access file: not under mu_
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(Room(entry->owner, limited));
  std::string id = RandomId();
  while (sessions_.count(id) != 0) id = RandomId();
  sessions_[id] = std::move(entry);
  Count();
  return id;
}

void SessionTable::Erase(const std::string& id) { Take(id); }

std::vector<SessionTable::Expired> SessionTable::ExpireIdle(absl::Time now, absl::Duration ttl) {
  std::vector<Expired> out;
  // Destroyed last, after both locks: an entry must not go while its own lock is held, and its
  // KV is freed outside the table's.
  std::vector<std::shared_ptr<Entry>> gone;
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    std::shared_ptr<Entry> e = it->second;
    bool expire = false;
    {
      absl::MutexLock entry_lock(&e->mu);
      expire = !e->busy && !e->migrating && now - e->last_used > ttl;
      if (expire) {
        e->expired = true;
        out.push_back({it->first, now - e->last_used});
      }
    }
    if (!expire) {
      ++it;
      continue;
    }
    gone.push_back(std::move(e));
    it = sessions_.erase(it);
  }
  if (!out.empty()) Count();
  return out;
}

absl::Status SessionTable::Gone(const std::string& id) {
  return absl::NotFoundError("session '" + id + "' expired: it was idle past this node's TTL");
}

absl::StatusOr<std::shared_ptr<SessionTable::Entry>> SessionTable::Find(
    const std::string& id, const OwnerFilter& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it != sessions_.end() && (!owner || it->second->owner == *owner)) return it->second;
  if (auto m = moved_.find(id); m != moved_.end() && (!owner || m->second.owner == *owner)) {
    return absl::NotFoundError(absl::StrCat("session '", id, "' moved to ",
                                            m->second.to.target_address, " as '",
                                            m->second.to.session_id, "'"));
  }
  return absl::NotFoundError("no session '" + id + "' on this node");
}

absl::StatusOr<SessionTable::Lease> SessionTable::Acquire(const std::string& id,
                                                          const OwnerFilter& owner) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(id, owner));
  absl::MutexLock lock(&entry->mu);
  // A migration pausing the session decides within its deadline whether it stays here.
  entry->mu.Await(absl::Condition(&Entry::Unpaused, entry.get()));
  if (entry->expired) return Gone(id);
  if (entry->moved) {
    return absl::NotFoundError(absl::StrCat("session '", id, "' moved to ",
                                            entry->moved->target_address, " as '",
                                            entry->moved->session_id, "'"));
  }
  if (entry->busy) {
    return absl::FailedPreconditionError("session '" + id + "' is busy (generating or migrating)");
  }
  entry->busy = true;
  return Lease(this, id, std::move(entry));
}

absl::StatusOr<SessionTable::Outbound> SessionTable::BeginMigration(const std::string& id,
                                                                    const OwnerFilter& owner) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(id, owner));
  absl::MutexLock lock(&entry->mu);
  if (entry->expired) return Gone(id);
  if (entry->migrating) {
    return absl::FailedPreconditionError("session '" + id + "' is already migrating");
  }
  entry->migrating = true;
  return Outbound(this, id, std::move(entry));
}

std::optional<SessionMoved> SessionTable::MovedTo(const std::string& id,
                                                  const OwnerFilter& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = moved_.find(id);
  if (it == moved_.end() || (owner && it->second.owner != *owner)) return std::nullopt;
  return it->second.to;
}

void SessionTable::Remember(const std::string& id, SessionMoved to, std::string owner) {
  absl::MutexLock lock(&mu_);
  if (moved_.insert_or_assign(id, MovedRecord{std::move(to), std::move(owner)}).second) {
    moved_order_.push_back(id);
  }
  while (moved_order_.size() > kMovedKept) {
    moved_.erase(moved_order_.front());
    moved_order_.pop_front();
  }
}

absl::Status SessionTable::Inspect(const std::string& id,
                                   const std::function<void(const NodeSession&)>& fn,
                                   const OwnerFilter& owner) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(id, owner));
  absl::MutexLock lock(&entry->mu);
  if (entry->expired) return Gone(id);
  if (entry->busy) return absl::FailedPreconditionError("session '" + id + "' is busy");
  entry->last_used = absl::Now();
  fn(*entry->session);
  return absl::OkStatus();
}

void SessionTable::ForEach(
    const std::function<void(const std::string& id, const NodeSession* session, bool migrating)>&
        fn,
    const OwnerFilter& owner) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : sessions_) {
    if (owner && entry->owner != *owner) continue;
    absl::MutexLock entry_lock(&entry->mu);
    fn(id, entry->busy ? nullptr : entry->session.get(), entry->migrating);
  }
}

size_t SessionTable::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionTable::Put(const std::string& id, std::shared_ptr<Entry> entry) {
  absl::MutexLock lock(&mu_);
  sessions_[id] = std::move(entry);
  Count();
}

void SessionTable::Take(const std::string& id) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(id);
  Count();
}

void SessionTable::Count() {
  if (on_count_) on_count_(sessions_.size());
}

SessionTable::Lease::Lease(SessionTable* table, std::string id, std::shared_ptr<Entry> entry)
    : table_(table),
      id_(std::move(id)),
      entry_(std::move(entry)),
      session_(entry_->session.get()) {}

SessionTable::Lease::~Lease() {
  if (entry_ == nullptr || !held_) return;  // moved from, or the session migrated
  absl::MutexLock lock(&entry_->mu);
  entry_->busy = false;
  entry_->last_used = absl::Now();
}

absl::Status SessionTable::Lease::Remove() {
  {
    absl::MutexLock lock(&entry_->mu);
    if (entry_->migrating) {
      return absl::FailedPreconditionError("session '" + id_ + "' is migrating");
    }
  }
  Withdraw();
  return absl::OkStatus();
}

void SessionTable::Lease::Publish(const std::function<void(NodeSession&)>& change) {
  absl::MutexLock lock(&entry_->mu);
  change(*session_);
}

std::optional<SessionMoved> SessionTable::Lease::Yield() {
  absl::MutexLock lock(&entry_->mu);
  if (!entry_->pause_wanted) return std::nullopt;
  entry_->busy = false;
  entry_->mu.Await(absl::Condition(&Entry::Unpaused, entry_.get()));
  if (entry_->moved) {
    held_ = false;
    return *entry_->moved;
  }
  entry_->mu.Await(absl::Condition(&Entry::Free, entry_.get()));
  entry_->busy = true;
  return std::nullopt;
}

void SessionTable::Lease::Withdraw() {
  if (in_table_) table_->Take(id_);
  in_table_ = false;
}

void SessionTable::Lease::Restore() {
  if (!in_table_) table_->Put(id_, entry_);
  in_table_ = true;
}

}  // namespace riskkv

namespace riskkv {

SessionTable::Outbound::Outbound(SessionTable* table, std::string id, std::shared_ptr<Entry> entry)
    : table_(table),
      id_(std::move(id)),
      entry_(std::move(entry)),
      session_(entry_->session.get()) {}

SessionTable::Outbound::~Outbound() {
  if (entry_ == nullptr) return;  // moved from
  absl::MutexLock lock(&entry_->mu);
  entry_->migrating = false;
  entry_->pause_wanted = false;
  entry_->last_used = absl::Now();
  if (paused_) entry_->busy = false;
}

void SessionTable::Outbound::Snapshot(std::vector<int32_t>* tokens,
                                      std::optional<Sampler>* sampler) const {
  absl::MutexLock lock(&entry_->mu);
  *tokens = session_->tokens;
  *sampler = session_->sampler;
}

int64_t SessionTable::Outbound::history_tokens() const {
  absl::MutexLock lock(&entry_->mu);
  return static_cast<int64_t>(session_->tokens.size()) - 1;
}

int64_t SessionTable::Outbound::AwaitHistory(int64_t rows, absl::Duration gap,
                                             absl::Time deadline) const {
  absl::MutexLock lock(&entry_->mu);
  const std::vector<int32_t>& tokens = session_->tokens;
  while (true) {
    const size_t seen = tokens.size();
    if (static_cast<int64_t>(seen) - 1 >= rows) break;
    const auto grown = [&tokens, seen] { return tokens.size() > seen; };
    if (!entry_->mu.AwaitWithDeadline(absl::Condition(&grown),
                                      std::min(deadline, absl::Now() + gap))) {
      break;
    }
  }
  return static_cast<int64_t>(tokens.size()) - 1;
}

absl::Status SessionTable::Outbound::Pause(absl::Time deadline) {
  if (paused_) return absl::OkStatus();
  absl::MutexLock lock(&entry_->mu);
  entry_->pause_wanted = true;
  if (!entry_->mu.AwaitWithDeadline(absl::Condition(&Entry::Free, entry_.get()), deadline)) {
    entry_->pause_wanted = false;
    return absl::DeadlineExceededError("session '" + id_ +
                                       "' stayed in use until the migration's deadline");
  }
  entry_->busy = true;
  paused_ = true;
  if (!paused_at_) paused_at_ = absl::Now();
  return absl::OkStatus();
}

double SessionTable::Outbound::paused_seconds() const {
  return paused_at_ ? absl::ToDoubleSeconds(absl::Now() - *paused_at_) : 0.0;
}

void SessionTable::Outbound::Unpause() {
  if (!paused_) return;
  absl::MutexLock lock(&entry_->mu);
  entry_->busy = false;
  entry_->pause_wanted = false;
  paused_ = false;
}

void SessionTable::Outbound::Withdraw() {
  if (in_table_) table_->Take(id_);
  in_table_ = false;
}

void SessionTable::Outbound::Restore() {
  if (!in_table_) table_->Put(id_, entry_);
  in_table_ = true;
}

void SessionTable::Outbound::Moved(SessionMoved to) {
  table_->Remember(id_, to, entry_->owner);
  absl::MutexLock lock(&entry_->mu);
  entry_->moved = std::move(to);
}

}  // namespace riskkv
