// Fork-join pool with chunk stealing and spin-then-sleep waiting.
#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <chrono>

namespace riskkv::cpu {
namespace {

// Polling budget before sleeping: long enough to catch the next op of a forward pass, short
// enough not to starve other processes. Measured in time because PAUSE costs 10 to 140 cycles
// depending on the core.
constexpr auto kSpinBudget = std::chrono::microseconds(50);

template <typename T, typename Pred>
void SpinThenWait(std::atomic<T>& a, Pred keep_waiting) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinBudget;
  for (int i = 0;; ++i) {
    T v = a.load(std::memory_order_acquire);
    if (!keep_waiting(v)) return;
    _mm_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
  }
  for (;;) {
    T v = a.load(std::memory_order_acquire);
    if (!keep_waiting(v)) return;
    a.wait(v, std::memory_order_acquire);
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::Work(Job& job) {
  for (;;) {
    const int64_t c = job.next.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.chunks) return;
    const int64_t begin = c * job.grain;
    try {
      job.fn(begin, std::min(job.n, begin + job.grain));
    } catch (...) {
      absl::MutexLock lock(&job.error_mu);
      if (!job.error) job.error = std::current_exception();
    }
    if (job.done.fetch_add(1, std::memory_order_acq_rel) + 1 == job.chunks) job.done.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint32_t seen = 0;
  for (;;) {
    SpinThenWait(generation_, [seen](uint32_t g) { return g == seen; });
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      job = current_;
    }
    if (job) Work(*job);
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  if (workers_.empty() || chunks == 1) {
    for (int64_t begin = 0; begin < n; begin += grain) fn(begin, std::min(n, begin + grain));
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = fn;
  job->n = n;
  job->grain = grain;
  job->chunks = chunks;
  {
    absl::MutexLock lock(&mu_);
    current_ = job;
  }
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  Work(*job);
  SpinThenWait(job->done, [chunks](int64_t d) { return d < chunks; });
  absl::MutexLock lock(&job->error_mu);
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace riskkv::cpu
