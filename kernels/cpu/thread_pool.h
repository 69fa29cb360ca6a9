// A small fork-join pool for the CPU backend. Work is split into chunks claimed from a shared
// counter, and the calling thread takes chunks too, so a worker the OS has not scheduled (a
// busy edge box) delays nothing: whoever runs does the work. Idle workers spin briefly, then
// sleep on a futex, instead of spinning for milliseconds as OpenMP's default policy does.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace riskkv::cpu {

class ThreadPool {
 public:
  // threads counts the caller: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of `grain` items (the last may be shorter),
  // in parallel; returns when every chunk has run. fn must be safe to call concurrently. If fn
  // throws, the remaining chunks still run (or are skipped) before the first exception is
  // rethrown here, so no worker ever touches the caller's stack after this returns.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job {
    std::function<void(int64_t, int64_t)> fn;
    int64_t n = 0, grain = 1, chunks = 0;
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
    absl::Mutex error_mu;
    std::exception_ptr error ABSL_GUARDED_BY(error_mu);  // first exception thrown by fn
  };
  static void Work(Job& job);
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);

  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  std::shared_ptr<Job> current_ ABSL_GUARDED_BY(mu_);  // kept alive by late workers' copies
  std::atomic<uint32_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace riskkv::cpu
