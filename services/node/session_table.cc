// The node's sessions (see session_table.h).
#include "services/node/session_table.h"

#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace riskkv {
namespace {

std::string RandomPrefix() {
  std::random_device rd;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%06x-", rd() & 0xFFFFFF);
  return buf;
}

}  // namespace

SessionTable::SessionTable(int max_sessions, std::function<void(size_t)> on_count)
    : max_sessions_(max_sessions), on_count_(std::move(on_count)), id_prefix_(RandomPrefix()) {}

absl::Status SessionTable::Full() const {
  return absl::ResourceExhaustedError(
      absl::StrCat("this node serves its limit of ", max_sessions_, " sessions"));
}

absl::Status SessionTable::CheckRoom() const {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return Full();
  return absl::OkStatus();
}

absl::StatusOr<std::string> SessionTable::Add(std::unique_ptr<NodeSession> session) {
  auto entry = std::make_shared<Entry>();
  entry->session = std::move(session);
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) return Full();
  std::string id = id_prefix_ + std::to_string(next_id_++);
  sessions_[id] = std::move(entry);
  Count();
  return id;
}

void SessionTable::Erase(const std::string& id) { Take(id); }

absl::StatusOr<std::shared_ptr<SessionTable::Entry>> SessionTable::Find(
    const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError("no session '" + id + "' on this node");
  return it->second;
}

absl::StatusOr<SessionTable::Lease> SessionTable::Acquire(const std::string& id) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(id));
  absl::MutexLock lock(&entry->mu);
  if (entry->busy) {
    return absl::FailedPreconditionError("session '" + id + "' is busy (generating or migrating)");
  }
  entry->busy = true;
  return Lease(this, id, std::move(entry));
}

absl::Status SessionTable::Inspect(const std::string& id,
                                   const std::function<void(const NodeSession&)>& fn) {
  ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, Find(id));
  absl::MutexLock lock(&entry->mu);
  if (entry->busy) return absl::FailedPreconditionError("session '" + id + "' is busy");
  fn(*entry->session);
  return absl::OkStatus();
}

void SessionTable::ForEach(
    const std::function<void(const std::string& id, const NodeSession* session)>& fn) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : sessions_) {
    absl::MutexLock entry_lock(&entry->mu);
    fn(id, entry->busy ? nullptr : entry->session.get());
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
  if (entry_ == nullptr) return;  // moved from
  absl::MutexLock lock(&entry_->mu);
  entry_->busy = false;
}

void SessionTable::Lease::Remove() { Withdraw(); }

void SessionTable::Lease::Withdraw() {
  if (in_table_) table_->Take(id_);
  in_table_ = false;
}

void SessionTable::Lease::Restore() {
  if (!in_table_) table_->Put(id_, entry_);
  in_table_ = true;
}

}  // namespace riskkv
