// The one way a node's calls reach its engine: they submit work items and wait; one thread forms
// each step from what waits (every waiting decode plus at most one chunk of a prefill, a replay
// or a scoring, under a token budget), runs it as one Engine::Step and hands each item its
// result. Items of a hand-over in flight go first (in a step of their own), then decodes, then
// prefill chunks, scoring last; no item starves (the bounds are stated on Scheduler). A session's
// logits and KV rows are the same bits as if it ran alone (Engine::Step's contract), so batching
// never changes what a session generates.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <span>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/engine/engine.h"

namespace riskkv {

// What an item is for, which is also its priority (highest first).
enum class WorkKind : uint8_t {
  kHandOver,  // a migration's steps: the target's rebuilds, replay and first token
  kDecode,    // one token of a generating session
  kPrefill,   // a new session's prompt, a live migration's pre-copy replay
  kScore,     // a teacher-forced scoring
};
inline constexpr int kWorkKinds = 4;
std::string_view WorkKindName(WorkKind kind);

struct SchedulerOptions {
  // The most tokens one step runs: every waiting single-token item (decodes, a hand-over's
  // first token) and then one chunk. Single-token items past it wait for the next step, first.
  int64_t batch_tokens = 256;
  // The most tokens of a prefill or scoring item in one step, so a long prompt does not stall
  // decodes for longer than one chunk; a hand-over's replay takes what the budget leaves.
  int64_t prefill_chunk = 64;
  // How long a step waits for the sessions that got a token from the step before to submit
  // their next one, so generating streams stay in one batch instead of splitting into two; a
  // tenth of the step before when that is longer (a stream that misses a step waits a whole one).
  absl::Duration gather = absl::Milliseconds(2);
  // A chunk item passed over for this many steps goes before every item that waited less.
  int max_skips = 4;
  // While a paused session resumes (Scheduler::Resuming), how long the scheduler keeps the
  // engine for the resume's next item after one finishes, instead of starting a step that item
  // would wait behind.
  absl::Duration handover_gap = absl::Milliseconds(5);

  // InvalidArgument naming the field out of range.
  absl::Status Validate() const;
};

// What the scheduler reports, for metrics; the default does nothing. Called on the scheduler's
// thread, which it holds up: keep it quick.
class SchedulerObserver {
 public:
  virtual ~SchedulerObserver() = default;
  // A batch step ran `items` items of `tokens` tokens in all, in `seconds`.
  virtual void StepRan(int64_t items, int64_t tokens, double seconds) {}
  // An item of `kind` waited `seconds` from its submission to its first step.
  virtual void Waited(WorkKind kind, double seconds) {}
};

class Scheduler {
 public:
  // Engine::Step: the scheduler passes a hook to call between layers (where it runs a
  // hand-over's waiting work), or null for a step that runs inside another's.
  using StepFn = std::function<std::vector<absl::Status>(
      std::span<const BatchItem> items, const Engine::BetweenLayers& between_layers)>;
  // Says whether an item may still run: a non-OK status (the call was cancelled, its session
  // went away) fails the item with it instead. The waiting thread calls it every 10 ms: an item
  // that has not run leaves the queue then; one whose chunk is in the step in flight stops after
  // that chunk.
  using CheckFn = std::function<absl::Status()>;

  // Runs its steps on `engine` (which must outlive it).
  Scheduler(Engine& engine, SchedulerOptions options, SchedulerObserver* observer = nullptr);
  // Runs its steps through `step`, whose logits rows have `vocab` values (tests use a fake).
  // `options` must be valid (SchedulerOptions::Validate; the process aborts otherwise).
  Scheduler(StepFn step, int64_t vocab, SchedulerOptions options,
            SchedulerObserver* observer = nullptr);
  // Lets the step in flight finish, fails every waiting item with Unavailable, and stops.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const SchedulerOptions& options() const { return options_; }

  // Runs `tokens` after the store's rows (as Engine::Step's item), in chunks when they are more
  // than one, and waits: the last position's logits, or every position's when all_logits. An
  // item stopped by its check after some of its chunks ran leaves their rows in the store.
  // *step_seconds, when given, gains the time of the steps its chunks ran in (the engine's work,
  // not the wait for it).
  absl::Status Forward(WorkKind kind, KvStore& store, std::span<const int32_t> tokens,
                       bool all_logits, std::vector<float>* logits, const CheckFn& check = nullptr,
                       double* step_seconds = nullptr);
  absl::StatusOr<std::vector<float>> Prefill(WorkKind kind, std::span<const int32_t> tokens,
                                             KvStore& store, const CheckFn& check = nullptr,
                                             double* step_seconds = nullptr);
  absl::StatusOr<std::vector<float>> Decode(WorkKind kind, int32_t token, KvStore& store,
                                            const CheckFn& check = nullptr) {
    return Prefill(kind, std::span<const int32_t>(&token, 1), store, check);
  }
  // Engine::Score's teacher-forced NLL, at scoring's priority, each position's logits shown to
  // `on_position` (ScoreContinuation). The caller has checked the continuation's ids and that it
  // fits the store.
  absl::StatusOr<NllResult> Score(std::span<const int32_t> continuation, KvStore& store,
                                  std::span<const float> first_logits,
                                  const CheckFn& check = nullptr,
                                  const PositionFn& on_position = nullptr);
  // Runs `task` alone between two steps (a RISK-KV rebuild), at `kind`'s priority, and waits.
  absl::Status Exclusive(WorkKind kind, const std::function<absl::Status()>& task,
                         const CheckFn& check = nullptr);

  // Held by a migration target from the moment its session is paused at the source until its
  // first token's logits: the resume's items (rebuilds, replay chunks, the first token) run
  // back to back, and between two of them the scheduler waits up to handover_gap for the next
  // rather than start a step of other sessions' work. A null scheduler holds nothing.
  class Resuming {
   public:
    explicit Resuming(Scheduler* scheduler);
    ~Resuming();
    Resuming(const Resuming&) = delete;
    Resuming& operator=(const Resuming&) = delete;

   private:
    Scheduler* const scheduler_;
  };

  // Steps run so far (batch and exclusive), for tests and the bench.
  int64_t steps() const ABSL_LOCKS_EXCLUDED(mu_);
  // Items waiting for a step (not counting those in the step in flight).
  size_t waiting() const ABSL_LOCKS_EXCLUDED(mu_);

  // A hand-over's items (its first token, a chunk of its replay) run in a batch step of their
  // own, so its downtime does not pay for the other sessions' decodes.
  //
  // Bounds, for items that do not fail. Outside a resume (Resuming), while items of several
  // sorts wait, exclusive tasks and steps of a hand-over's work alone each run at most every
  // other step, so:
  //  - a single-token item (decode, first token) runs in the first or second batch step formed
  //    after it arrives, unless more of them wait than the step has room for (batch_tokens, less
  //    one chunk when a chunk item has waited max_skips steps): then those waiting longest go
  //    first.
  //  - a chunk item (prefill, replay, scoring) gets its next chunk within max_skips + N batch
  //    steps that are not a hand-over's alone, N the number of other chunk items waiting; in
  //    all steps, within 2 (max_skips + N) + 1.
  // A hand-over's item that arrives while a batch step runs does not wait for the whole step: the
  // scheduler runs it between two of the step's layers (on the CPU engine), as a step of its own
  // inside the other.
  // A resume holds the engine for its own work only: its rebuild groups, its replay in chunks of
  // batch_tokens and its first token, plus at most handover_gap after each; then the bounds above
  // apply again. That is the paused session's downtime, which is what the hand-over's priority
  // is for.

 private:
  struct Item;
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Submits `item` and waits for it (or for its check to fail while it waits).
  absl::Status Submit(Item& item, const CheckFn& check) ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static bool IsHandOver(const Item* item);
  // An item of a hand-over (or, `handover` false, of anything else) waits for a batch step.
  bool Waiting(bool handover) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A hand-over's item or an exclusive task waits: no step waits for returning streams.
  bool Urgent() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Gathered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A resume's next item arrived, or no resume is under way (or the scheduler stops).
  bool ResumeReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A hand-over's item finished: a resume under way gets handover_gap for its next one.
  void HandOverRan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chunk item to serve next, or null.
  Item* PickChunk() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first hand-over chunk item not in the step in flight, or null.
  Item* FirstHandOverChunk() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a step's items out of the queues and marks them running: the waiting single-token
  // items (hand-overs' first, and only theirs when handover_only) up to batch_tokens, less room
  // for one chunk of `chunk` when it starves; then what the budget leaves of `chunk` (a
  // hand-over's replay takes all of it, others at most prefill_chunk). Returns the chunk item
  // served, with *chunk_tokens, or null.
  Item* FormStep(Item* chunk, bool handover_only, std::vector<Item*>* singles,
                 int64_t* chunk_tokens) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `item` out of whichever queue holds it.
  void Unqueue(Item* item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Finish(Item* item, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunExclusive(Item* item) ABSL_LOCKS_EXCLUDED(mu_);
  void RunBatch(std::vector<Item*> singles, Item* chunk, int64_t chunk_tokens)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Between two layers of a batch step: runs a waiting hand-over's exclusive task or its items
  // (its first tokens and one chunk of its replay) as a step inside the step.
  void BetweenLayers() ABSL_LOCKS_EXCLUDED(mu_);

  const StepFn step_;
  const int64_t vocab_;
  const SchedulerOptions options_;
  SchedulerObserver* const observer_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  int submitters_ ABSL_GUARDED_BY(mu_) = 0;  // calls inside Submit; the destructor waits for them
  bool last_exclusive_ ABSL_GUARDED_BY(mu_) = false;
  bool last_handover_alone_ ABSL_GUARDED_BY(mu_) = false;
  int resuming_ ABSL_GUARDED_BY(mu_) = 0;         // Resuming scopes open
  absl::Time resume_until_ ABSL_GUARDED_BY(mu_);  // how long to wait for a resume's next item
  // The scheduler thread's alone: a step runs inside another (BetweenLayers), and the time such
  // steps took inside the step in flight (not the outer step's own).
  bool nested_ = false;
  double nested_seconds_ = 0;
  std::deque<Item*> singles_ ABSL_GUARDED_BY(mu_);    // single-token items, in arrival order
  std::deque<Item*> chunks_ ABSL_GUARDED_BY(mu_);     // multi-token items, in arrival order
  std::deque<Item*> exclusive_ ABSL_GUARDED_BY(mu_);  // tasks, by kind then arrival
  // Stores whose decode the last step ran: their next decode is expected within `gather`.
  absl::flat_hash_set<const KvStore*> returning_ ABSL_GUARDED_BY(mu_);
  absl::Time gather_until_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace riskkv
