// The step scheduler against a fake engine: waiting decodes share one step, a long prompt goes
// in chunks between them, a hand-over's work goes first, no chunk item waits past its bound,
// exclusive tasks alternate with batch steps, a resume's items run back to back (for no longer
// than its gap allows), and an item that fails, is cancelled or outlives the scheduler fails
// alone.
#include "common/engine/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <list>
#include <map>
#include <thread>

#include "absl/synchronization/notification.h"

namespace riskkv {
namespace {

constexpr int64_t kVocab = 4;

// A KV store that only counts rows and remembers the tokens run into it.
class FakeStore final : public KvStore {
 public:
  explicit FakeStore(int id) : KvStore(nullptr), id_(id) {}
  int id() const { return id_; }
  int64_t n_tokens() const override { return static_cast<int64_t>(seen.size()); }
  int64_t capacity() const override { return 1 << 20; }
  DType dtype() const override { return DType::kF32; }
  absl::Status SetTokens(int64_t n) override {
    seen.resize(n);
    return absl::OkStatus();
  }
  absl::Status WriteRows(int32_t, bool, int64_t, int64_t, DType, const uint8_t*) override {
    return absl::UnimplementedError("fake");
  }
  absl::Status FinishLayer(int32_t) override { return absl::UnimplementedError("fake"); }
  absl::Status ReadRows(int32_t, bool, int64_t, int64_t, uint8_t*) const override {
    return absl::UnimplementedError("fake");
  }
  absl::Status PrepareRead(int64_t) const override { return absl::UnimplementedError("fake"); }

  std::vector<int32_t> seen;  // the step thread's alone

 private:
  int id_;
};

// One item of a step, as the fake engine saw it.
struct Seen {
  int store;
  int64_t tokens;
  bool operator==(const Seen&) const = default;
};

// A fake engine: appends each item's tokens to its store and writes logits {token, position, 0,
// 0} for each row wanted; a token < 0 fails its item. Records every step when it ends; `gate`,
// when set, holds the first step until notified. A step has `layers` layers: it calls the
// scheduler's hook between each two, before it records itself.
class FakeEngine {
 public:
  Scheduler::StepFn Step() {
    return [this](std::span<const BatchItem> items, const Engine::BetweenLayers& between) {
      if (gate != nullptr && steps_run_++ == 0) gate->WaitForNotification();
      for (int l = 0; between && l + 1 < layers; ++l) between();
      std::vector<absl::Status> status;
      std::vector<Seen> step;
      for (const BatchItem& item : items) {
        auto& store = static_cast<FakeStore&>(*item.store);
        step.push_back({store.id(), static_cast<int64_t>(item.tokens.size())});
        if (std::any_of(item.tokens.begin(), item.tokens.end(), [](int32_t t) { return t < 0; })) {
          status.push_back(absl::InvalidArgumentError("token below 0"));
          continue;
        }
        const int64_t n = static_cast<int64_t>(item.tokens.size());
        const int64_t first = item.all_logits ? 0 : n - 1;
        if (item.logits != nullptr) item.logits->clear();
        for (int64_t i = 0; i < n; ++i) {
          store.seen.push_back(item.tokens[i]);
          if (item.logits != nullptr && i >= first) {
            item.logits->insert(item.logits->end(),
                                {static_cast<float>(item.tokens[i]),
                                 static_cast<float>(store.seen.size() - 1), 0.0f, 0.0f});
          }
        }
        status.push_back(absl::OkStatus());
      }
      absl::MutexLock lock(&mu);
      log.push_back(std::move(step));
      if (step_sleep > absl::ZeroDuration()) absl::SleepFor(step_sleep);
      return status;
    };
  }
  std::vector<std::vector<Seen>> Log() {
    absl::MutexLock lock(&mu);
    return log;
  }

  absl::Notification* gate = nullptr;
  absl::Duration step_sleep = absl::ZeroDuration();
  int layers = 1;
  absl::Mutex mu;
  std::vector<std::vector<Seen>> log ABSL_GUARDED_BY(mu);

 private:
  int steps_run_ = 0;  // the step thread's alone
};

// Waits until `n` items wait in `s` (the first step, gated, holds none of them).
void AwaitWaiting(const Scheduler& s, size_t n) {
  for (int i = 0; i < 2000 && s.waiting() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(s.waiting(), n);
}

// A decode of token 1 into `held` whose step the fake engine's gate holds: returns its thread
// once the step has started, so what is submitted next waits behind it.
std::thread HoldAStep(Scheduler& s, FakeStore& held) {
  std::thread hold([&s, &held] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 1, held).ok()); });
  for (int i = 0; i < 200 && s.steps() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  return hold;
}

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = from + i;
  return t;
}

TEST(SchedulerOptionsTest, RefusesValuesOutOfRange) {
  EXPECT_TRUE(SchedulerOptions{}.Validate().ok());
  EXPECT_EQ(SchedulerOptions{.batch_tokens = 0}.Validate().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status chunk = SchedulerOptions{.batch_tokens = 8, .prefill_chunk = 9}.Validate();
  EXPECT_NE(chunk.message().find("prefill chunk 9"), std::string_view::npos) << chunk;
  EXPECT_FALSE(SchedulerOptions{.gather = absl::Seconds(2)}.Validate().ok());
  EXPECT_FALSE(SchedulerOptions{.max_skips = -1}.Validate().ok());
  SchedulerOptions gap;
  gap.handover_gap = absl::Milliseconds(-1);
  EXPECT_FALSE(gap.Validate().ok());
}

TEST(SchedulerTest, WaitingDecodesShareOneStep) {
  FakeEngine fake;
  fake.step_sleep = absl::Milliseconds(2);
  // A generous gather: sanitizers and a loaded machine may be slow to wake a stream's thread.
  Scheduler s(fake.Step(), kVocab, {.gather = absl::Milliseconds(200)});
  constexpr int kSessions = 8, kTokens = 20;
  std::vector<std::unique_ptr<FakeStore>> stores;
  for (int i = 0; i < kSessions; ++i) stores.push_back(std::make_unique<FakeStore>(i));
  std::atomic<int> wrong{0};
  std::list<std::thread> streams;
  for (int i = 0; i < kSessions; ++i) {
    streams.emplace_back([&, i] {
      for (int t = 0; t < kTokens; ++t) {
        auto logits = s.Decode(WorkKind::kDecode, 100 * i + t, *stores[i]);
        if (!logits.ok() || *logits != std::vector<float>{100.0f * i + t, 1.0f * t, 0, 0}) ++wrong;
      }
    });
  }
  for (auto& t : streams) t.join();
  EXPECT_EQ(wrong, 0);
  // The first steps may start before every stream arrived, and a stream whose thread wakes
  // later than the gather (a sanitizer on a loaded machine) runs a step behind; the rest of the
  // time they move together. One step per token of each stream would be 160.
  const auto log = fake.Log();
  EXPECT_LE(log.size(), static_cast<size_t>(kTokens + kSessions));
  size_t full = 0;
  for (const auto& step : log) full += step.size() == kSessions;
  EXPECT_GE(full, static_cast<size_t>(kTokens / 2));
  for (int i = 0; i < kSessions; ++i) EXPECT_EQ(stores[i]->seen, Range(100 * i, kTokens));
}

TEST(SchedulerTest, ALongPromptGoesInChunksBetweenDecodes) {
  FakeEngine fake;
  Scheduler s(fake.Step(), kVocab,
              {.batch_tokens = 64, .prefill_chunk = 16, .gather = absl::Milliseconds(100)});
  FakeStore prompt(0), a(1), b(2);
  std::atomic<bool> done{false};
  std::list<std::thread> streams;
  for (FakeStore* st : {&a, &b}) {
    streams.emplace_back([&, st] {
      for (int t = 0; !done; ++t) ASSERT_TRUE(s.Decode(WorkKind::kDecode, t, *st).ok());
    });
  }
  absl::SleepFor(absl::Milliseconds(5));
  auto logits = s.Prefill(WorkKind::kPrefill, Range(0, 100), prompt);
  done = true;
  for (auto& t : streams) t.join();
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_EQ(*logits, (std::vector<float>{99, 99, 0, 0})) << "the last position's logits";
  EXPECT_EQ(prompt.seen, Range(0, 100));
  int chunks = 0, shared = 0;
  for (const auto& step : fake.Log()) {
    int64_t tokens = 0;
    for (const Seen& it : step) {
      tokens += it.tokens;
      if (it.store != 0) {
        EXPECT_EQ(it.tokens, 1);
      }
    }
    EXPECT_LE(tokens, 64);
    const auto p =
        std::find_if(step.begin(), step.end(), [](const Seen& it) { return it.store == 0; });
    if (p == step.end()) continue;
    ++chunks;
    EXPECT_LE(p->tokens, 16);
    shared += step.size() > 1;
  }
  EXPECT_EQ(chunks, 7) << "100 tokens in chunks of 16";
  EXPECT_GE(shared, 5) << "decodes ran beside the prompt's chunks";
}

TEST(SchedulerTest, HandOverFirstThenDecodesThenPrefillThenScoringWithinTheStarvationBound) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  const SchedulerOptions options{.batch_tokens = 9, .prefill_chunk = 8, .max_skips = 2};
  Scheduler s(fake.Step(), kVocab, options);
  FakeStore held(0), handover(1), prefill(2), score(3), decode(4), first(5);
  std::list<std::thread> calls;
  calls.push_back(HoldAStep(s, held));
  // Queued behind the held step, in the reverse of their priority.
  calls.emplace_back([&] {
    std::vector<float> logits;
    ASSERT_TRUE(s.Forward(WorkKind::kScore, score, Range(0, 24), true, &logits).ok());
    ASSERT_EQ(logits.size(), 24u * kVocab);
    for (int r = 0; r < 24; ++r) EXPECT_EQ(logits[r * kVocab + 1], r) << "row " << r;
  });
  AwaitWaiting(s, 1);
  calls.emplace_back(
      [&] { ASSERT_TRUE(s.Prefill(WorkKind::kPrefill, Range(0, 24), prefill).ok()); });
  AwaitWaiting(s, 2);
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 7, decode).ok()); });
  AwaitWaiting(s, 3);
  calls.emplace_back(
      [&] { ASSERT_TRUE(s.Prefill(WorkKind::kHandOver, Range(0, 40), handover).ok()); });
  AwaitWaiting(s, 4);
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kHandOver, 9, first).ok()); });
  AwaitWaiting(s, 5);
  gate.Notify();
  for (auto& t : calls) t.join();
  const auto log = fake.Log();
  ASSERT_GE(log.size(), 2u);
  // The first step after the held one: the hand-over's first token and a chunk of its replay,
  // alone, with what the budget leaves (9 - 1 tokens); then the decode, beside the hand-over's
  // next chunk (it still ranks first for the chunk); then the hand-over alone again.
  EXPECT_EQ(log[1], (std::vector<Seen>{{5, 1}, {1, 8}}));
  EXPECT_EQ(log[2], (std::vector<Seen>{{4, 1}, {1, 8}}));
  EXPECT_EQ(log[3], (std::vector<Seen>{{1, 9}}));
  // Every chunk item gets its next chunk within 2 (max_skips + other chunk items) + 1 steps.
  const size_t bound = 2 * (options.max_skips + 2) + 1;
  std::map<int, size_t> last = {{1, 0}, {2, 0}, {3, 0}};  // arrived before step 1
  std::map<int, int64_t> ran;
  for (size_t i = 1; i < log.size(); ++i) {
    int chunk_items = 0;
    for (const Seen& it : log[i]) {
      if (!last.contains(it.store)) continue;
      ++chunk_items;
      EXPECT_LE(i - last[it.store], bound) << "store " << it.store << " at step " << i;
      last[it.store] = i;
      ran[it.store] += it.tokens;
      EXPECT_LE(it.tokens, it.store == 1 ? 9 : 8);
    }
    EXPECT_LE(chunk_items, 1) << "one chunk a step";
    for (auto& [store, at] : last) {
      const int64_t total = store == 1 ? 40 : 24;
      if (ran[store] < total) {
        EXPECT_LE(i + 1 - at, bound + 1) << "store " << store << " waits";
      }
    }
  }
  EXPECT_EQ(ran[1], 40);
  EXPECT_EQ(ran[2], 24);
  EXPECT_EQ(ran[3], 24);
  // The hand-over keeps the chunk while the others have not waited max_skips steps it could have
  // shared; then the prefill, which outranks the scoring that waited as long, then the scoring.
  ASSERT_GE(log.size(), 8u);
  EXPECT_EQ(log[4], (std::vector<Seen>{{1, 9}}));
  EXPECT_EQ(log[5], (std::vector<Seen>{{1, 6}}));
  EXPECT_EQ(log[6], (std::vector<Seen>{{2, 8}}));
  EXPECT_EQ(log[7], (std::vector<Seen>{{3, 8}}));
}

TEST(SchedulerTest, ExclusiveTasksAlternateWithBatchSteps) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  Scheduler s(fake.Step(), kVocab, {});
  FakeStore held(0), a(1), b(2);
  absl::Mutex mu;
  std::vector<std::string> order;
  std::list<std::thread> calls;
  calls.push_back(HoldAStep(s, held));
  for (int t = 0; t < 3; ++t) {
    calls.emplace_back([&, t] {
      const std::function<absl::Status()> task = [&, t] {
        absl::MutexLock lock(&mu);
        order.push_back("task" + std::to_string(t) + "@" + std::to_string(fake.Log().size()));
        return t == 1 ? absl::DataLossError("a rebuild failed") : absl::OkStatus();
      };
      const absl::Status st = s.Exclusive(WorkKind::kHandOver, task);
      EXPECT_EQ(st.code(), t == 1 ? absl::StatusCode::kDataLoss : absl::StatusCode::kOk);
    });
    AwaitWaiting(s, t + 1);
  }
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 2, a).ok()); });
  AwaitWaiting(s, 4);
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 3, b).ok()); });
  AwaitWaiting(s, 5);
  gate.Notify();
  for (auto& t : calls) t.join();
  // Batch steps logged before each task: the held step, then one batch between tasks 0 and 1
  // while decodes waited, then none (nothing waited).
  EXPECT_EQ(order, (std::vector<std::string>{"task0@1", "task1@2", "task2@2"}));
  const auto log = fake.Log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1], (std::vector<Seen>{{1, 1}, {2, 1}}));
}

// A resuming target (Scheduler::Resuming) submits its items one after another, each when the one
// before has finished; its rebuilds, its replay's chunks and its first token run back to back
// while two decodes wait, and the decodes run right after.
TEST(SchedulerTest, AResumeRunsItsItemsBackToBack) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  SchedulerOptions options;
  options.handover_gap = absl::Milliseconds(500);  // far more than a thread's next call takes
  Scheduler s(fake.Step(), kVocab, options);
  FakeStore held(0), a(1), b(2), target(3);
  absl::Mutex mu;
  std::vector<std::string> order;
  std::list<std::thread> calls;
  calls.push_back(HoldAStep(s, held));
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 2, a).ok()); });
  AwaitWaiting(s, 1);
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 3, b).ok()); });
  AwaitWaiting(s, 2);
  const std::vector<int32_t> replay = Range(10, 300);
  calls.emplace_back([&] {
    const Scheduler::Resuming resuming(&s);
    for (int t = 0; t < 2; ++t) {
      ASSERT_TRUE(s.Exclusive(WorkKind::kHandOver, [&, t] {
                     absl::MutexLock lock(&mu);
                     order.push_back("task" + std::to_string(t) + "@" +
                                     std::to_string(fake.Log().size()));
                     return absl::OkStatus();
                   }).ok());
    }
    ASSERT_TRUE(s.Prefill(WorkKind::kHandOver, replay, target).ok());
    ASSERT_TRUE(s.Decode(WorkKind::kHandOver, 7, target).ok());
  });
  AwaitWaiting(s, 3);
  gate.Notify();
  for (auto& t : calls) t.join();
  EXPECT_EQ(order, (std::vector<std::string>{"task0@1", "task1@1"}));
  EXPECT_EQ(fake.Log(), (std::vector<std::vector<Seen>>{
                            {{0, 1}}, {{3, 256}}, {{3, 44}}, {{3, 1}}, {{1, 1}, {2, 1}}}));
}

// A resume holds the engine only for handover_gap after its last item: a resuming target that
// takes longer to send its next item finds the waiting decodes run before it.
TEST(SchedulerTest, AResumeHoldsTheEngineNoLongerThanTheGap) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  SchedulerOptions options;
  options.handover_gap = absl::Milliseconds(20);
  Scheduler s(fake.Step(), kVocab, options);
  FakeStore held(0), a(1), target(3);
  std::list<std::thread> calls;
  calls.push_back(HoldAStep(s, held));
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 2, a).ok()); });
  AwaitWaiting(s, 1);
  calls.emplace_back([&] {
    const Scheduler::Resuming resuming(&s);
    ASSERT_TRUE(s.Exclusive(WorkKind::kHandOver, [] { return absl::OkStatus(); }).ok());
    absl::SleepFor(absl::Milliseconds(500));
    ASSERT_TRUE(s.Decode(WorkKind::kHandOver, 7, target).ok());
  });
  AwaitWaiting(s, 2);
  gate.Notify();
  for (auto& t : calls) t.join();
  EXPECT_EQ(fake.Log(), (std::vector<std::vector<Seen>>{{{0, 1}}, {{1, 1}}, {{3, 1}}}));
}

// A hand-over's rebuild and first token that arrive while a step runs run between its layers,
// each as a step of its own inside it, before the step ends; the decode that waited with them
// goes in the next step.
TEST(SchedulerTest, AHandOverRunsBetweenTheLayersOfTheStepInFlight) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  fake.layers = 4;
  Scheduler s(fake.Step(), kVocab, {});
  FakeStore held(0), a(1), target(3);
  std::string task_ran;
  std::list<std::thread> calls;
  calls.push_back(HoldAStep(s, held));
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kDecode, 2, a).ok()); });
  AwaitWaiting(s, 1);
  calls.emplace_back([&] {
    ASSERT_TRUE(s.Exclusive(WorkKind::kHandOver, [&] {
                   task_ran = "after " + std::to_string(fake.Log().size()) + " steps";
                   return absl::OkStatus();
                 }).ok());
  });
  AwaitWaiting(s, 2);
  calls.emplace_back([&] { ASSERT_TRUE(s.Decode(WorkKind::kHandOver, 7, target).ok()); });
  AwaitWaiting(s, 3);
  gate.Notify();
  for (auto& t : calls) t.join();
  EXPECT_EQ(task_ran, "after 0 steps");
  EXPECT_EQ(fake.Log(), (std::vector<std::vector<Seen>>{{{3, 1}}, {{0, 1}}, {{1, 1}}}));
  EXPECT_EQ(target.seen, (std::vector<int32_t>{7}));
  EXPECT_EQ(s.steps(), 4);
}

// The chunk of a hand-over's replay that a step runs is not waiting work between that step's
// layers: its next chunk goes in the next step, not inside this one.
TEST(SchedulerTest, AReplayChunkInFlightIsNotRunAgainBetweenItsLayers) {
  FakeEngine fake;
  fake.layers = 4;
  Scheduler s(fake.Step(), kVocab, {});
  FakeStore target(3);
  const std::vector<int32_t> replay = Range(10, 300);
  ASSERT_TRUE(s.Prefill(WorkKind::kHandOver, replay, target).ok());
  EXPECT_EQ(fake.Log(), (std::vector<std::vector<Seen>>{{{3, 256}}, {{3, 44}}}));
  EXPECT_EQ(target.seen, replay);
}

TEST(SchedulerTest, AFailedItemFailsAloneAndTheRestOfItsStepCompletes) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  Scheduler s(fake.Step(), kVocab, {});
  FakeStore held(0), good(1), bad(2);
  std::thread hold = HoldAStep(s, held);
  std::thread first([&] { EXPECT_TRUE(s.Decode(WorkKind::kDecode, 5, good).ok()); });
  AwaitWaiting(s, 1);
  std::thread second([&] {
    EXPECT_EQ(s.Decode(WorkKind::kDecode, -1, bad).status().code(),
              absl::StatusCode::kInvalidArgument);
  });
  AwaitWaiting(s, 2);
  gate.Notify();
  for (std::thread* t : {&hold, &first, &second}) t->join();
  EXPECT_EQ(fake.Log()[1].size(), 2u) << "both in one step";
  EXPECT_EQ(good.seen, (std::vector<int32_t>{5}));
  EXPECT_TRUE(bad.seen.empty());
  EXPECT_EQ(s.Forward(WorkKind::kPrefill, good, {}, false, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, ACancelledItemLeavesTheQueueAtOnce) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  Scheduler s(fake.Step(), kVocab, {});
  FakeStore held(0), gone(1);
  std::thread hold = HoldAStep(s, held);
  std::atomic<bool> cancelled{false};
  absl::Notification returned;
  std::thread call([&] {
    auto r = s.Prefill(WorkKind::kPrefill, Range(0, 50), gone, [&] {
      return cancelled ? absl::CancelledError("the caller went away") : absl::OkStatus();
    });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
    returned.Notify();
  });
  AwaitWaiting(s, 1);
  cancelled = true;
  // While the step in flight is still held: the item leaves without waiting for it.
  EXPECT_TRUE(returned.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(s.waiting(), 0u);
  gate.Notify();
  call.join();
  hold.join();
  EXPECT_TRUE(gone.seen.empty());
}

TEST(SchedulerTest, ACancelledPromptStopsAfterTheChunkInFlight) {
  FakeEngine fake;
  fake.step_sleep = absl::Milliseconds(30);
  Scheduler s(fake.Step(), kVocab, {.batch_tokens = 64, .prefill_chunk = 16});
  FakeStore prompt(0);
  std::atomic<bool> cancelled{false};
  absl::StatusOr<std::vector<float>> got;
  std::thread call([&] {
    got = s.Prefill(WorkKind::kPrefill, Range(0, 160), prompt, [&] {
      return cancelled ? absl::CancelledError("the caller went away") : absl::OkStatus();
    });
  });
  for (int i = 0; i < 2000 && s.steps() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  cancelled = true;  // while its first chunk runs
  call.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kCancelled) << got.status();
  const auto log = fake.Log();
  EXPECT_LE(log.size(), 3u) << "it stopped after the chunk in flight, not after 10";
  EXPECT_EQ(prompt.seen.size(), 16 * log.size());
  EXPECT_EQ(s.waiting(), 0u);
}

TEST(SchedulerTest, StoppingFailsWhatWaitsAfterTheStepInFlight) {
  FakeEngine fake;
  absl::Notification gate;
  fake.gate = &gate;
  auto s = std::make_unique<Scheduler>(fake.Step(), kVocab, SchedulerOptions{});
  FakeStore held(0), late(1);
  std::thread hold([&] { EXPECT_TRUE(s->Decode(WorkKind::kDecode, 1, held).ok()); });
  for (int i = 0; i < 200 && s->steps() == 0; ++i) absl::SleepFor(absl::Milliseconds(1));
  std::thread wait([&] {
    EXPECT_EQ(s->Decode(WorkKind::kDecode, 2, late).status().code(),
              absl::StatusCode::kUnavailable);
  });
  AwaitWaiting(*s, 1);
  std::thread stop([&] { s.reset(); });
  absl::SleepFor(absl::Milliseconds(20));
  gate.Notify();
  stop.join();
  hold.join();
  wait.join();
  EXPECT_EQ(held.seen, (std::vector<int32_t>{1}));
  EXPECT_TRUE(late.seen.empty());
}

}  // namespace
}  // namespace riskkv
