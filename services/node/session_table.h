// The decoding sessions a node serves: ids, the session limit, lookup, exclusive use of a session
// by one call at a time, listing, and a migration's hold on a session: it copies the session
// while calls go on using it, pauses it (a generating call yields at its next token and waits
// for the outcome), and hands it over or gives it back.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"
#include "common/model/sampler.h"
#include "services/node/kv_budget.h"

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
  // StartSession's prefill, counted into the first Generate's time to first token; -1 once
  // counted (and for a session that migrated here).
  double prompt_seconds = -1;
  KvBudget::Charge charge;  // the rows of kv, against the node's KV budget
  // The identity that started it (access_list.h; "" on a node without an access file). Fixed
  // for the session's life, and carried along when it migrates.
  std::string owner;
};

// Whose sessions a call may see and touch: one owner's, or (nullopt) every session. Another
// owner's session is NotFound, as one that does not exist.
using OwnerFilter = std::optional<std::string>;

// Where a migration took a session.
struct SessionMoved {
  std::string target_address;
  std::string session_id;  // on the target
};

class SessionTable {
  struct Entry;

 public:
  // `on_count` hears the number of sessions after every change (metrics); may be null. An owner
  // (a non-empty NodeSession::owner) that `limited` says is held to quotas (null: every one)
  // holds at most `max_per_owner` sessions (0: no limit but max_sessions).
  explicit SessionTable(int max_sessions, std::function<void(size_t)> on_count = nullptr,
                        int max_per_owner = 0,
                        std::function<bool(const std::string& owner)> limited = nullptr);

  // A session's exclusive use by one call; releases it when destroyed.
  class Lease {
   public:
    Lease(Lease&&) = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    const std::string& id() const { return id_; }
    NodeSession& session() { return *session_; }

    // Removes the session from the table for good (closing it); FailedPrecondition while a
    // migration copies it.
    absl::Status Remove();
    // Takes the session out of the table, keeping it here: the second phase of a hand-over.
    // Restore puts it back under the same id (the target did not confirm).
    void Withdraw();
    void Restore();
    // Runs `change` under the session's lock: every change a migration copying the session
    // reads (tokens, sampler) goes through here while a migration may run.
    void Publish(const std::function<void(NodeSession&)>& change);
    // Between two steps of a long call (Generate): when a migration waits to pause the session,
    // lets it and waits for the outcome. The target's address and id when the session moved
    // (the lease no longer holds it); nullopt when it is still this call's to use.
    std::optional<SessionMoved> Yield();

   private:
    friend class SessionTable;
    Lease(SessionTable* table, std::string id, std::shared_ptr<Entry> entry);
    SessionTable* table_;
    std::string id_;
    std::shared_ptr<Entry> entry_;
    NodeSession* session_;
    bool in_table_ = true;
    bool held_ = true;
  };

  // A migration's hold on a session. While it copies, calls go on using the session (a call
  // holding a lease changes it only through Publish); Pause then takes it from them. Destroying
  // the hold ends the migration: a paused session that did not move serves here again.
  class Outbound {
   public:
    Outbound(Outbound&&) = default;
    Outbound& operator=(Outbound&&) = delete;
    ~Outbound();
    const std::string& id() const { return id_; }
    // The store, stable while the hold lasts; rows of the tokens a Snapshot saw never change.
    const KvStore& kv() const { return *session_->kv; }
    // The session's tokens and sampler now.
    void Snapshot(std::vector<int32_t>* tokens, std::optional<Sampler>* sampler) const;
    // Its history now: every token but the last.
    int64_t history_tokens() const;
    // Waits while the session keeps growing until its history reaches `rows`: returns the
    // history when it did, or when no token came for `gap` (nothing is generating) or at
    // `deadline`.
    int64_t AwaitHistory(int64_t rows, absl::Duration gap, absl::Time deadline) const;
    // Waits until no call uses the session (a Generate yields at its next token) and holds it:
    // it is paused. DeadlineExceeded when that takes past `deadline`. No-op once paused.
    absl::Status Pause(absl::Time deadline);
    bool paused() const { return paused_; }
    // Seconds since the first Pause (0 before it): the session's downtime so far.
    double paused_seconds() const;
    // The paused session, for the migration's own use.
    NodeSession& session() { return *session_; }
    // Lets calls use the session again (a migration attempt that failed).
    void Unpause();
    // The hand-over's second phase, as Lease's.
    void Withdraw();
    void Restore();
    // The target took the session: calls waiting on it, and later calls naming its id, learn
    // where it went.
    void Moved(SessionMoved to);

   private:
    friend class SessionTable;
    Outbound(SessionTable* table, std::string id, std::shared_ptr<Entry> entry);
    SessionTable* table_;
    std::string id_;
    std::shared_ptr<Entry> entry_;
    NodeSession* session_;
    bool paused_ = false;
    bool in_table_ = true;
    std::optional<absl::Time> paused_at_;
  };

  // ResourceExhausted when the node serves its limit, or `owner` (if not empty) its own.
  absl::Status CheckRoom(const std::string& owner = "") const ABSL_LOCKS_EXCLUDED(mu_);
  // Adds a session under a new id; ResourceExhausted when the node serves its limit, or the
  // session's owner its own.
  absl::StatusOr<std::string> Add(std::unique_ptr<NodeSession> session) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes a session no call uses (a registration that must be undone).
  void Erase(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // An expired session: its id and how long it had been idle.
  struct Expired {
    std::string id;
    absl::Duration idle;
  };
  // Closes every session no call or migration has used for longer than `ttl` up to `now`; a
  // call that found one of them just before learns it expired.
  std::vector<Expired> ExpireIdle(absl::Time now, absl::Duration ttl) ABSL_LOCKS_EXCLUDED(mu_);
  // The session for exclusive use: NotFound (naming where it went if it migrated), or
  // FailedPrecondition while another call uses it. A call that arrives while a migration
  // pauses the session waits for the migration's outcome.
  absl::StatusOr<Lease> Acquire(const std::string& id, const OwnerFilter& owner = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A migration's hold on the session: NotFound, or FailedPrecondition while another
  // migration holds it.
  absl::StatusOr<Outbound> BeginMigration(const std::string& id,
                                          const OwnerFilter& owner = std::nullopt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Where a session that migrated from here went (the last kMovedKept of them).
  std::optional<SessionMoved> MovedTo(const std::string& id,
                                      const OwnerFilter& owner = std::nullopt) const
      ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr size_t kMovedKept = 1024;
  // Calls `fn` with the session while no call uses it: NotFound or FailedPrecondition (busy).
  absl::Status Inspect(const std::string& id, const std::function<void(const NodeSession&)>& fn,
                       const OwnerFilter& owner = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);
  // Calls `fn` for every session in id order; `session` is null while a call uses it (its
  // state belongs to that call); `migrating` while a migration holds it.
  void ForEach(const std::function<void(const std::string& id, const NodeSession* session,
                                        bool migrating)>& fn,
               const OwnerFilter& owner = std::nullopt) ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    std::string owner;  // the session's, fixed when it is added
    absl::Mutex mu;
    bool busy ABSL_GUARDED_BY(mu) = false;
    bool migrating ABSL_GUARDED_BY(mu) = false;              // an Outbound holds it
    bool pause_wanted ABSL_GUARDED_BY(mu) = false;           // the Outbound pauses or paused it
    bool expired ABSL_GUARDED_BY(mu) = false;                // closed by ExpireIdle
    absl::Time last_used ABSL_GUARDED_BY(mu) = absl::Now();  // the end of its last use
    std::optional<SessionMoved> moved ABSL_GUARDED_BY(mu);
    // Written by the call holding the lease (busy), read by others while not busy; tokens and
    // sampler change under mu while migrating (Publish) and a migration reads them under mu.
    std::unique_ptr<NodeSession> session;
    // Conditions to wait on (evaluated with mu held).
    static bool Free(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) { return !e->busy; }
    static bool Unpaused(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu) { return !e->pause_wanted; }
  };
  absl::Status Full() const;
  // Whether `owner` is held to max_per_owner (asks `limited`, which may read a file: called
  // before mu_ is taken).
  bool Limited(const std::string& owner) const ABSL_LOCKS_EXCLUDED(mu_);
  // The room check of Add and CheckRoom; `limited` is Limited(owner).
  absl::Status Room(const std::string& owner, bool limited) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static absl::Status Gone(const std::string& id);
  // The one lookup: NotFound naming the id (and where it went, to its owner).
  absl::StatusOr<std::shared_ptr<Entry>> Find(const std::string& id, const OwnerFilter& owner) const
      ABSL_LOCKS_EXCLUDED(mu_);
  void Put(const std::string& id, std::shared_ptr<Entry> entry) ABSL_LOCKS_EXCLUDED(mu_);
  void Take(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void Remember(const std::string& id, SessionMoved to, std::string owner) ABSL_LOCKS_EXCLUDED(mu_);
  void Count() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_sessions_;
  const int max_per_owner_;
  const std::function<bool(const std::string&)> limited_;
  const std::function<void(size_t)> on_count_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> sessions_ ABSL_GUARDED_BY(mu_);
  struct MovedRecord {
    SessionMoved to;
    std::string owner;
  };
  std::map<std::string, MovedRecord> moved_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> moved_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace riskkv
