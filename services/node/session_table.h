// The decoding sessions a node serves: ids, the session limit, lookup, exclusive use of a session
// by one call at a time, and listing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/engine.h"
#include "common/model/sampler.h"

namespace riskkv {

// One session's state. Either every token but the last has its KV row (the last is fed by the
// next decode step), or every token has, and pending_logits hold the next token's logits (after
// a prefill or a migration, before the next Generate).
struct NodeSession {
  std::unique_ptr<KvStore> kv;
  std::vector<int32_t> tokens;
  std::vector<float> pending_logits;
  std::optional<Sampler> sampler;
  int64_t generated = 0;
};

class SessionTable {
  struct Entry;

 public:
  // `on_count` hears the number of sessions after every change (metrics); may be null.
  explicit SessionTable(int max_sessions, std::function<void(size_t)> on_count = nullptr);

  // A session's exclusive use by one call; releases it when destroyed.
  class Lease {
   public:
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    const std::string& id() const { return id_; }
    NodeSession& session() { return *session_; }

    // Removes the session from the table for good (closing it).
    void Remove();
    // Takes the session out of the table, keeping it here: the second phase of a hand-over.
    // Restore puts it back under the same id (the target did not confirm).
    void Withdraw();
    void Restore();

   private:
    friend class SessionTable;
    Lease(SessionTable* table, std::string id, std::shared_ptr<Entry> entry);
    SessionTable* table_;
    std::string id_;
    std::shared_ptr<Entry> entry_;
    NodeSession* session_;
    bool in_table_ = true;
  };

  // ResourceExhausted when the node serves its limit.
  absl::Status CheckRoom() const ABSL_LOCKS_EXCLUDED(mu_);
  // Adds a session under a new id; ResourceExhausted when the node serves its limit.
  absl::StatusOr<std::string> Add(std::unique_ptr<NodeSession> session) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a session no call uses (a registration that must be undone).
  void Erase(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // The session for exclusive use: NotFound, or FailedPrecondition while another call uses it.
  absl::StatusOr<Lease> Acquire(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `fn` with the session while no call uses it: NotFound or FailedPrecondition (busy).
  absl::Status Inspect(const std::string& id, const std::function<void(const NodeSession&)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `fn` for every session in id order; `session` is null while a call uses it (its
  // state belongs to that call).
  void ForEach(const std::function<void(const std::string& id, const NodeSession* session)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    absl::Mutex mu;
    bool busy ABSL_GUARDED_BY(mu) = false;
    // Written only by the call holding the lease (busy), read by others only while not busy.
    std::unique_ptr<NodeSession> session;
  };
  absl::Status Full() const;
  // The one lookup: NotFound naming the id.
  absl::StatusOr<std::shared_ptr<Entry>> Find(const std::string& id) const ABSL_LOCKS_EXCLUDED(mu_);
  void Put(const std::string& id, std::shared_ptr<Entry> entry) ABSL_LOCKS_EXCLUDED(mu_);
  void Take(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void Count() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_sessions_;
  const std::function<void(size_t)> on_count_;
  const std::string id_prefix_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> sessions_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace riskkv
