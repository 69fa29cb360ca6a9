// The node's step scheduler (see scheduler.h).
#include "common/engine/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/base/stopwatch.h"

namespace riskkv {

std::string_view WorkKindName(WorkKind kind) {
  switch (kind) {
    case WorkKind::kHandOver:
      return "handover";
    case WorkKind::kDecode:
      return "decode";
    case WorkKind::kPrefill:
      return "prefill";
    case WorkKind::kScore:
      return "score";
  }
  return "unknown";
}

absl::Status SchedulerOptions::Validate() const {
  if (batch_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch tokens ", batch_tokens, " is not >= 1"));
  }
  if (prefill_chunk < 1 || prefill_chunk > batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill chunk ", prefill_chunk, " is not in [1, batch tokens ", batch_tokens, "]"));
  }
  if (gather < absl::ZeroDuration() || gather > absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather ", absl::FormatDuration(gather), " is not in [0, 1s]"));
  }
  if (max_skips < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max skips ", max_skips, " is below 0"));
  }
  if (handover_gap < absl::ZeroDuration() || handover_gap > absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hand-over gap ", absl::FormatDuration(handover_gap), " is not in [0, 1s]"));
  }
  return absl::OkStatus();
}

struct Scheduler::Item {
  WorkKind kind = WorkKind::kDecode;
  // A forward item.
  KvStore* store = nullptr;
  std::span<const int32_t> tokens;
  bool all_logits = false;
  std::vector<float>* logits = nullptr;
  int64_t done_tokens = 0;  // tokens the steps so far ran
  // An exclusive item.
  const std::function<absl::Status()>* task = nullptr;

  int64_t order = 0;  // arrival
  absl::Time submitted;
  bool started = false;   // its first step ran
  bool running = false;   // in the step in flight
  bool finished = false;  // status is final
  absl::Status status;
  absl::Status cancel;       // its check failed while a chunk of it ran: stop after that chunk
  double step_seconds = 0;   // the steps it ran in
  int skips = 0;             // steps that passed this chunk item over since it was last served
  int64_t last_served = -1;  // the step that last ran one of its chunks
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions options, SchedulerObserver* observer)
    : Scheduler(
          [&engine](std::span<const BatchItem> items, const Engine::BetweenLayers& between) {
            return engine.Step(items, between);
          },
          engine.config().vocab, options, observer) {}

Scheduler::Scheduler(StepFn step, int64_t vocab, SchedulerOptions options,
                     SchedulerObserver* observer)
    : step_(std::move(step)), vocab_(vocab), options_(options), observer_(observer) {
  if (absl::Status ok = options_.Validate(); !ok.ok()) {
    std::fprintf(stderr, "Scheduler: %s\n", ok.ToString().c_str());
    std::abort();
  }
  thread_ = std::thread([this] { Run(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  // The items failed as the thread stopped; their callers leave before the mutex goes.
  mu_.LockWhen(absl::Condition(
      +[](int* n) { return *n == 0; }, &submitters_));
  mu_.Unlock();
}

Scheduler::Resuming::Resuming(Scheduler* scheduler) : scheduler_(scheduler) {
  if (scheduler_ == nullptr) return;
  absl::MutexLock lock(&scheduler_->mu_);
  ++scheduler_->resuming_;
  scheduler_->resume_until_ = absl::Now() + scheduler_->options_.handover_gap;
}

Scheduler::Resuming::~Resuming() {
  if (scheduler_ == nullptr) return;
  absl::MutexLock lock(&scheduler_->mu_);
  --scheduler_->resuming_;
}

int64_t Scheduler::steps() const {
  absl::MutexLock lock(&mu_);
  return steps_;
}

size_t Scheduler::waiting() const {
  absl::MutexLock lock(&mu_);
  size_t n = singles_.size() + exclusive_.size();
  for (const Item* it : chunks_) n += it->running ? 0 : 1;
  return n;
}

absl::Status Scheduler::Forward(WorkKind kind, KvStore& store, std::span<const int32_t> tokens,
                                bool all_logits, std::vector<float>* logits, const CheckFn& check,
                                double* step_seconds) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens to run");
  if (logits != nullptr && all_logits) {
    logits->assign(static_cast<int64_t>(tokens.size()) * vocab_, 0.0f);
  }
  Item item;
  item.kind = kind;
  item.store = &store;
  item.tokens = tokens;
  item.all_logits = all_logits;
  item.logits = logits;
  absl::Status ran = Submit(item, check);
  if (step_seconds != nullptr) *step_seconds += item.step_seconds;
  return ran;
}

absl::StatusOr<std::vector<float>> Scheduler::Prefill(WorkKind kind,
                                                      std::span<const int32_t> tokens,
                                                      KvStore& store, const CheckFn& check,
                                                      double* step_seconds) {
  std::vector<float> logits;
  absl::Status ran =
      Forward(kind, store, tokens, /*all_logits=*/false, &logits, check, step_seconds);
  if (!ran.ok()) return ran;
  return logits;
}

absl::StatusOr<NllResult> Scheduler::Score(std::span<const int32_t> continuation, KvStore& store,
                                           std::span<const float> first_logits,
                                           const CheckFn& check, const PositionFn& on_position) {
  return ScoreContinuation(
      continuation, vocab_, first_logits,
      [&](std::span<const int32_t> batch, std::vector<float>* logits) {
        return Forward(WorkKind::kScore, store, batch, /*all_logits=*/true, logits, check);
      },
      on_position);
}

absl::Status Scheduler::Exclusive(WorkKind kind, const std::function<absl::Status()>& task,
                                  const CheckFn& check) {
  Item item;
  item.kind = kind;
  item.task = &task;
  return Submit(item, check);
}

absl::Status Scheduler::Submit(Item& item, const CheckFn& check) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine's scheduler is stopping");
  item.order = arrivals_++;
  ++submitters_;
  item.submitted = absl::Now();
  if (item.task != nullptr) {
    // Exclusive tasks by kind, then arrival.
    auto at = std::find_if(exclusive_.begin(), exclusive_.end(),
                           [&](const Item* q) { return q->kind > item.kind; });
    exclusive_.insert(at, &item);
  } else {
    returning_.erase(item.store);
    const bool single = item.tokens.size() == 1 &&
                        (item.kind == WorkKind::kHandOver || item.kind == WorkKind::kDecode);
    (single ? singles_ : chunks_).push_back(&item);
  }
  // Poll the check while waiting, so a cancelled call leaves the queue within a poll.
  constexpr absl::Duration kPoll = absl::Milliseconds(10);
  while (!mu_.AwaitWithTimeout(absl::Condition(&item.finished), check ? kPoll : absl::Hours(1))) {
    if (!check) continue;
    mu_.Unlock();
    absl::Status ok = check();
    mu_.Lock();
    if (ok.ok() || item.finished) continue;
    if (!item.running) {
      Unqueue(&item);
      Finish(&item, std::move(ok));
    } else {
      item.cancel = std::move(ok);  // the step in flight stops it after its chunk
    }
  }
  --submitters_;
  return item.status;
}

bool Scheduler::HasWork() const {
  return stopping_ || !singles_.empty() || !chunks_.empty() || !exclusive_.empty();
}

bool Scheduler::Gathered() const { return stopping_ || returning_.empty() || Urgent(); }

bool Scheduler::ResumeReady() const { return stopping_ || resuming_ == 0 || Urgent(); }

void Scheduler::HandOverRan() {
  if (resuming_ > 0) resume_until_ = absl::Now() + options_.handover_gap;
}

bool Scheduler::IsHandOver(const Item* it) { return it->kind == WorkKind::kHandOver; }

bool Scheduler::Waiting(bool handover) const {
  // A chunk item stays queued while a chunk of it runs (inside that step, it is not waiting).
  auto is = [handover](const Item* it) { return IsHandOver(it) == handover && !it->running; };
  return std::any_of(singles_.begin(), singles_.end(), is) ||
         std::any_of(chunks_.begin(), chunks_.end(), is);
}

bool Scheduler::Urgent() const { return !exclusive_.empty() || Waiting(/*handover=*/true); }

void Scheduler::Unqueue(Item* item) {
  for (std::deque<Item*>* q : {&singles_, &chunks_, &exclusive_}) {
    q->erase(std::remove(q->begin(), q->end(), item), q->end());
  }
}

void Scheduler::Finish(Item* item, absl::Status status) {
  item->status = std::move(status);
  item->running = false;
  item->finished = true;
}

Scheduler::Item* Scheduler::PickChunk() const {
  Item* best = nullptr;
  // Starving items first, longest unserved; then by kind and arrival.
  auto key = [&](const Item* it) {
    const bool starving = it->skips >= options_.max_skips;
    return std::make_tuple(starving ? 0 : 1, starving ? it->last_served : 0,
                           static_cast<int>(it->kind), it->order);
  };
  for (Item* it : chunks_) {
    if (best == nullptr || key(it) < key(best)) best = it;
  }
  return best;
}

void Scheduler::Run() {
  for (;;) {
    mu_.LockWhen(absl::Condition(this, &Scheduler::HasWork));
    if (!ResumeReady() && absl::Now() < resume_until_) {
      // A paused session is resuming: its next item (the next rebuild, replay chunk or its
      // first token) is on its way; a step started now would hold it up for a whole step.
      mu_.AwaitWithDeadline(absl::Condition(this, &Scheduler::ResumeReady), resume_until_);
    }
    if (!stopping_ && !returning_.empty() && !Urgent()) {
      // Wait for the streams that just got a token, so their next decodes share this step; a
      // hand-over's work or a rebuild does not wait for them.
      mu_.AwaitWithDeadline(absl::Condition(this, &Scheduler::Gathered), gather_until_);
      returning_.clear();
    }
    if (stopping_) {
      mu_.Unlock();
      break;
    }
    if (singles_.empty() && chunks_.empty() && exclusive_.empty()) {
      mu_.Unlock();  // what waited was cancelled while the step gathered
      continue;
    }
    const bool batch_waiting = !singles_.empty() || !chunks_.empty();
    // A resume's items run back to back; otherwise exclusive tasks and a hand-over's steps
    // alternate with the other sessions' steps.
    const bool resuming = resuming_ > 0;
    if (!exclusive_.empty() &&
        (!batch_waiting || !last_exclusive_ || (resuming && IsHandOver(exclusive_.front())))) {
      Item* task = exclusive_.front();
      exclusive_.pop_front();
      task->running = true;
      last_exclusive_ = true;
      ++steps_;
      mu_.Unlock();
      RunExclusive(task);
      continue;
    }
    last_exclusive_ = false;
    // A hand-over's items run in a step of their own, so the paused session's downtime does not
    // pay for every other session's decode; never twice in a row while other items wait.
    const bool alone = Waiting(/*handover=*/true) &&
                       (!last_handover_alone_ || !Waiting(/*handover=*/false) || resuming);
    last_handover_alone_ = alone;
    std::vector<Item*> singles;
    int64_t chunk_tokens = 0;
    Item* chunk = FormStep(alone ? FirstHandOverChunk() : PickChunk(), /*handover_only=*/alone,
                           &singles, &chunk_tokens);
    for (Item* it : chunks_) {
      // A step of a hand-over's work alone passes over nobody: no one else could run in it.
      if (it == chunk || (alone && !IsHandOver(it))) continue;
      ++it->skips;
    }
    ++steps_;
    mu_.Unlock();
    RunBatch(std::move(singles), chunk, chunk_tokens);
  }
  // Nothing runs any more: fail what waits.
  absl::MutexLock lock(&mu_);
  for (std::deque<Item*>* q : {&singles_, &chunks_, &exclusive_}) {
    for (Item* it : *q) Finish(it, absl::UnavailableError("the engine's scheduler stopped"));
    q->clear();
  }
}

Scheduler::Item* Scheduler::FirstHandOverChunk() const {
  auto first = std::find_if(chunks_.begin(), chunks_.end(),
                            [](const Item* it) { return IsHandOver(it) && !it->running; });
  return first == chunks_.end() ? nullptr : *first;
}

Scheduler::Item* Scheduler::FormStep(Item* chunk, bool handover_only, std::vector<Item*>* singles,
                                     int64_t* chunk_tokens) {
  int64_t budget = options_.batch_tokens;
  // A starving chunk item keeps room for one chunk whatever else waits.
  const int64_t reserve =
      chunk != nullptr && chunk->skips >= options_.max_skips
          ? std::min<int64_t>(options_.prefill_chunk,
                              static_cast<int64_t>(chunk->tokens.size()) - chunk->done_tokens)
          : 0;
  for (WorkKind kind : {WorkKind::kHandOver, WorkKind::kDecode}) {
    if (handover_only && kind != WorkKind::kHandOver) continue;
    for (Item* it : singles_) {
      if (it->kind != kind || budget - reserve <= 0) continue;
      singles->push_back(it);
      --budget;
    }
  }
  for (Item* it : *singles) {
    singles_.erase(std::find(singles_.begin(), singles_.end(), it));
    it->running = true;
  }
  *chunk_tokens = 0;
  if (chunk == nullptr) return nullptr;
  const int64_t left = static_cast<int64_t>(chunk->tokens.size()) - chunk->done_tokens;
  const int64_t most =
      chunk->kind == WorkKind::kHandOver ? budget : std::min(options_.prefill_chunk, budget);
  *chunk_tokens = std::min(left, most);
  if (*chunk_tokens <= 0) return nullptr;
  chunk->skips = 0;
  chunk->last_served = steps_;
  chunk->running = true;
  return chunk;
}

void Scheduler::BetweenLayers() {
  Item* task = nullptr;
  Item* chunk = nullptr;
  int64_t chunk_tokens = 0;
  std::vector<Item*> singles;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (!exclusive_.empty() && IsHandOver(exclusive_.front())) {
      task = exclusive_.front();
      exclusive_.pop_front();
      task->running = true;
    } else if (Waiting(/*handover=*/true)) {
      chunk = FormStep(FirstHandOverChunk(), /*handover_only=*/true, &singles, &chunk_tokens);
    } else {
      return;
    }
    ++steps_;
  }
  const Stopwatch clock;
  nested_ = true;
  if (task != nullptr) {
    RunExclusive(task);
  } else {
    RunBatch(std::move(singles), chunk, chunk_tokens);
  }
  nested_ = false;
  nested_seconds_ += clock.Seconds();
}

void Scheduler::RunExclusive(Item* item) {
  const absl::Time start = absl::Now();
  if (observer_) observer_->Waited(item->kind, absl::ToDoubleSeconds(start - item->submitted));
  absl::Status status = (*item->task)();
  absl::MutexLock lock(&mu_);
  if (IsHandOver(item)) HandOverRan();
  Finish(item, std::move(status));
}

void Scheduler::RunBatch(std::vector<Item*> singles, Item* chunk, int64_t chunk_tokens) {
  std::vector<BatchItem> batch;
  batch.reserve(singles.size() + 1);
  for (Item* it : singles) {
    batch.push_back({.store = it->store,
                     .tokens = it->tokens,
                     .all_logits = it->all_logits,
                     .logits = it->logits});
  }
  std::vector<float> chunk_logits;
  bool last_chunk = false;
  if (chunk != nullptr) {
    last_chunk = chunk->done_tokens + chunk_tokens == static_cast<int64_t>(chunk->tokens.size());
    const bool wants = chunk->logits != nullptr && (chunk->all_logits || last_chunk);
    batch.push_back({.store = chunk->store,
                     .tokens = chunk->tokens.subspan(chunk->done_tokens, chunk_tokens),
                     .all_logits = chunk->all_logits,
                     .logits = wants ? &chunk_logits : nullptr});
  }
  const absl::Time start = absl::Now();
  if (observer_) {
    for (Item* it : singles) {
      if (!it->started) observer_->Waited(it->kind, absl::ToDoubleSeconds(start - it->submitted));
    }
    if (chunk != nullptr && !chunk->started) {
      observer_->Waited(chunk->kind, absl::ToDoubleSeconds(start - chunk->submitted));
    }
  }
  const Stopwatch clock;
  std::vector<absl::Status> status;
  double step_seconds = 0;
  if (nested_) {
    status = step_(batch, nullptr);
    step_seconds = clock.Seconds();
  } else {
    nested_seconds_ = 0;
    status = step_(batch, [this] { BetweenLayers(); });
    step_seconds = clock.Seconds() - nested_seconds_;
  }
  status.resize(batch.size(), absl::InternalError("the step returned no status for an item"));
  if (observer_) {
    int64_t tokens = 0;
    for (const BatchItem& b : batch) tokens += static_cast<int64_t>(b.tokens.size());
    observer_->StepRan(static_cast<int64_t>(batch.size()), tokens, step_seconds);
  }
  absl::MutexLock lock(&mu_);
  if (std::any_of(singles.begin(), singles.end(), IsHandOver) ||
      (chunk != nullptr && IsHandOver(chunk))) {
    HandOverRan();
  }
  // A stream that misses the next step waits a whole step more: behind a long step (a prompt's
  // chunk) its decoders are worth a longer wait.
  const absl::Time gather_until =
      absl::Now() + std::max(options_.gather, absl::Seconds(step_seconds / 10));
  for (size_t i = 0; i < singles.size(); ++i) {
    Item* it = singles[i];
    it->started = true;
    it->step_seconds += step_seconds;
    if (status[i].ok() && it->kind == WorkKind::kDecode) {
      returning_.insert(it->store);
      gather_until_ = gather_until;
    }
    Finish(it, std::move(status[i]));
  }
  if (chunk == nullptr) return;
  chunk->started = true;
  chunk->running = false;
  chunk->step_seconds += step_seconds;
  absl::Status& ran = status.back();
  if (ran.ok() && !chunk_logits.empty()) {
    if (chunk->all_logits) {
      std::copy(chunk_logits.begin(), chunk_logits.end(),
                chunk->logits->begin() + chunk->done_tokens * vocab_);
    } else {
      *chunk->logits = std::move(chunk_logits);
    }
  }
  chunk->done_tokens += chunk_tokens;
  if (ran.ok() && !last_chunk && !chunk->cancel.ok()) ran = chunk->cancel;
  if (!ran.ok() || last_chunk) {
    Unqueue(chunk);
    Finish(chunk, std::move(ran));
  }
}

}  // namespace riskkv
