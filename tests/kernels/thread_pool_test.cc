// The CPU backend's fork-join pool: exact chunking, concurrent callers, teardown right after
// use, and exceptions from any chunk reaching the caller only after every chunk has finished.
#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace riskkv::cpu {
namespace {

using Chunk = std::pair<int64_t, int64_t>;
using Clock = std::chrono::steady_clock;

// Every chunk fn was called with, in call order (sorted by the caller when needed).
std::vector<Chunk> RecordChunks(ThreadPool& pool, int64_t n, int64_t grain) {
  std::mutex mu;
  std::vector<Chunk> chunks;
  pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(begin, end);
  });
  return chunks;
}

std::vector<Chunk> ExpectedChunks(int64_t n, int64_t grain) {
  std::vector<Chunk> out;
  for (int64_t b = 0; b < n; b += grain) out.emplace_back(b, std::min(n, b + grain));
  return out;
}

// Waits (yielding) until pred() holds or a generous deadline passes; returns pred().
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ThreadPool, ReportsThreadCount) {
  EXPECT_EQ(ThreadPool(1).threads(), 1);
  EXPECT_EQ(ThreadPool(4).threads(), 4);
}

TEST(ThreadPool, VisitsEveryIndexOnceInExactChunks) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 5, 16, 17, 100, 1000, 10007}) {
      for (int64_t grain : {1, 2, 3, 16, 64, 100000}) {
        std::vector<std::atomic<int>> visits(n);
        std::mutex mu;
        std::vector<Chunk> chunks;
        pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1, std::memory_order_relaxed);
          std::lock_guard<std::mutex> lock(mu);
          chunks.emplace_back(begin, end);
        });
        const std::string where = "threads=" + std::to_string(threads) + " n=" + std::to_string(n) +
                                  " grain=" + std::to_string(grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[i].load(), 1) << where << " index " << i;
        // Chunk k is exactly [k * grain, min(n, (k + 1) * grain)), each called once.
        std::sort(chunks.begin(), chunks.end());
        ASSERT_EQ(chunks, ExpectedChunks(n, grain)) << where;
      }
    }
  }
}

TEST(ThreadPool, EmptyRangeNeverCallsFn) {
  ThreadPool pool(4);
  for (int64_t n : {0, -1, -100}) {
    bool called = false;
    pool.ParallelFor(n, 4, [&](int64_t, int64_t) { called = true; });
    EXPECT_FALSE(called) << "n=" << n;
  }
}

TEST(ThreadPool, ChunksRunOnSeveralThreads) {
  // Not a guarantee the pool makes, but with slow chunks and four threads a pool that never
  // hands work to its workers would be a regression; allow plenty of time for them to wake.
  ThreadPool pool(4);
  std::mutex mu;
  std::vector<std::thread::id> ids;
  pool.ParallelFor(64, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu);
    ids.push_back(std::this_thread::get_id());
  });
  std::sort(ids.begin(), ids.end());
  EXPECT_GT(std::unique(ids.begin(), ids.end()) - ids.begin(), 1);
}

TEST(ThreadPool, TwoCallersShareOnePool) {
  // Each caller checks its own sums every iteration, so a chunk of one caller's job run with
  // the other's function, or a job returning early, shows up as a wrong sum.
  ThreadPool pool(4);
  constexpr int kIterations = 20000;
  auto caller = [&pool](int64_t n, int64_t grain, int64_t* bad) {
    for (int it = 0; it < kIterations; ++it) {
      std::atomic<int64_t> sum{0}, calls{0};
      pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
        int64_t s = 0;
        for (int64_t i = begin; i < end; ++i) s += i + it;
        sum.fetch_add(s, std::memory_order_relaxed);
        calls.fetch_add(1, std::memory_order_relaxed);
      });
      if (sum.load() != n * (n - 1) / 2 + n * it || calls.load() != (n + grain - 1) / grain) ++*bad;
    }
  };
  int64_t bad_a = 0, bad_b = 0;
  std::thread a(caller, 37, 3, &bad_a);
  std::thread b(caller, 50, 7, &bad_b);
  a.join();
  b.join();
  EXPECT_EQ(bad_a, 0);
  EXPECT_EQ(bad_b, 0);
  // Still a working pool afterwards.
  EXPECT_EQ(RecordChunks(pool, 10, 4).size(), 3u);
}

TEST(ThreadPool, DestroyedRightAfterUse) {
  for (int round = 0; round < 200; ++round) {
    std::atomic<int64_t> sum{0};
    {
      ThreadPool pool(1 + round % 5);
      pool.ParallelFor(100, 1 + round % 7, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sum.fetch_add(i, std::memory_order_relaxed);
      });
    }  // workers may still be waking up for the job they never got
    ASSERT_EQ(sum.load(), 4950) << "round " << round;
  }
  for (int round = 0; round < 50; ++round) ThreadPool never_used(4);
}

// Exceptions. Contract: whatever chunk throws (on the caller or a worker), ParallelFor returns
// only after every chunk has finished, then rethrows the first exception; the pool stays usable.

// Runs a two-chunk job on a one-worker pool in which the caller and the worker each hold one
// chunk at the same time (each waits for the other to enter), then calls caller_body or
// worker_body depending on which thread it is.
struct Handshake {
  std::atomic<bool> caller_in{false}, worker_in{false};
  std::atomic<bool> timed_out{false};
};

template <typename CallerBody, typename WorkerBody>
void RunOnBothThreads(ThreadPool& pool, Handshake& h, CallerBody caller_body,
                      WorkerBody worker_body) {
  const auto caller_id = std::this_thread::get_id();
  pool.ParallelFor(2, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller_id) {
      h.caller_in = true;
      if (!WaitFor([&] { return h.worker_in.load(); })) h.timed_out = true;
      caller_body();
    } else {
      h.worker_in = true;
      if (!WaitFor([&] { return h.caller_in.load(); })) h.timed_out = true;
      worker_body();
    }
  });
}

TEST(ThreadPool, WorkerExceptionReachesCaller) {
  ThreadPool pool(2);
  Handshake h;
  std::atomic<bool> caller_done{false};
  try {
    RunOnBothThreads(
        pool, h,
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          caller_done = true;
        },
        [] { throw std::runtime_error("from worker"); });
    ADD_FAILURE() << "ParallelFor returned normally";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "from worker");
    EXPECT_TRUE(caller_done.load());
  }
  EXPECT_FALSE(h.timed_out.load());
  auto chunks = RecordChunks(pool, 9, 2);  // still usable
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks, ExpectedChunks(9, 2));
}

TEST(ThreadPool, CallerExceptionWaitsForWorkerChunk) {
  ThreadPool pool(2);
  Handshake h;
  std::atomic<bool> worker_done{false};
  try {
    RunOnBothThreads(
        pool, h, [] { throw std::invalid_argument("from caller"); },
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          worker_done = true;
        });
    ADD_FAILURE() << "ParallelFor returned normally";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "from caller");
    // The worker's chunk captures this frame by reference: it must be over by now.
    EXPECT_TRUE(worker_done.load()) << "ParallelFor rethrew while a worker chunk was running";
  }
  EXPECT_FALSE(h.timed_out.load());
  // Keep the frame alive for a pool that broke the contract, so the failure stays a failure.
  WaitFor([&] { return worker_done.load(); });
}

TEST(ThreadPool, FirstExceptionWins) {
  // The worker throws first; the caller throws well after. Only the first is rethrown.
  ThreadPool pool(2);
  Handshake h;
  std::atomic<bool> worker_threw{false};
  try {
    RunOnBothThreads(
        pool, h,
        [&] {
          WaitFor([&] { return worker_threw.load(); });
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          throw std::runtime_error("second");
        },
        [&] {
          worker_threw = true;
          throw std::runtime_error("first");
        });
    ADD_FAILURE() << "ParallelFor returned normally";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first");
  }
  EXPECT_FALSE(h.timed_out.load());
}

TEST(ThreadPool, SingleThreadPoolPropagates) {
  ThreadPool pool(1);
  int64_t calls = 0;
  EXPECT_THROW(pool.ParallelFor(10, 1,
                                [&](int64_t begin, int64_t) {
                                  ++calls;
                                  if (begin == 3) throw std::out_of_range("three");
                                }),
               std::out_of_range);
  EXPECT_GE(calls, 4);  // chunks 0..3 ran; later ones may run or be skipped
  EXPECT_EQ(RecordChunks(pool, 10, 4), ExpectedChunks(10, 4));
}

TEST(ThreadPool, ThrowingChunksNeverOutliveTheCallAndPoolRecovers) {
  // Many jobs in which some chunks throw, on whichever thread claims them: after each throw no
  // chunk is running, none starts later, and a normal job right after covers its range.
  ThreadPool pool(4);
  for (int it = 0; it < 300; ++it) {
    const int64_t n = 40 + it % 23, grain = 1 + it % 4;
    std::atomic<int> in_flight{0}, entered{0};
    bool threw = false;
    try {
      pool.ParallelFor(n, grain, [&](int64_t begin, int64_t) {
        in_flight.fetch_add(1);
        entered.fetch_add(1);
        struct Leave {
          std::atomic<int>& c;
          ~Leave() { c.fetch_sub(1); }
        } leave{in_flight};
        if (it % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        if ((begin / grain) % 7 == it % 7)
          throw std::runtime_error("chunk " + std::to_string(begin));
      });
    } catch (const std::runtime_error& e) {
      threw = true;
      ASSERT_EQ(std::string(e.what()).rfind("chunk ", 0), 0u) << e.what();
      const int64_t begin = std::stoll(std::string(e.what()).substr(6));
      EXPECT_EQ((begin / grain) % 7, it % 7) << "rethrew an exception no chunk threw";
    }
    ASSERT_TRUE(threw) << "iteration " << it;
    ASSERT_EQ(in_flight.load(), 0)
        << "a chunk was still running when ParallelFor threw, iteration " << it;
    const int after = entered.load();
    std::vector<std::atomic<int>> visits(n);
    pool.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(visits[i].load(), 1) << "iteration " << it << " index " << i;
    ASSERT_EQ(entered.load(), after) << "a chunk of the failed job started after it returned";
  }
}

}  // namespace
}  // namespace riskkv::cpu
