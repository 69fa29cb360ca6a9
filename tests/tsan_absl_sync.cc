// Makes absl::Mutex and absl::CondVar visible to ThreadSanitizer in the tsan build. Debian's
// Abseil is compiled without TSan, so its lock and wait functions carry none of the annotations
// that tell TSan a lock was taken: every access guarded by an absl::Mutex would look like a race.
// These definitions interpose on the shared library's (the test binary's symbols come first for
// the whole process, gRPC's own locks included), report each lock, unlock and wait to TSan the
// way Abseil's own TSan build does, and call the real function found with dlsym(RTLD_NEXT).
// Linked into the test binaries of the tsan preset only.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "absl/base/config.h"
#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace {

#define RISKKV_STRINGIFY_INNER(x) #x
#define RISKKV_STRINGIFY(x) RISKKV_STRINGIFY_INNER(x)

// `suffix` is the Itanium mangling after "_ZN4absl<inline namespace>"; substitutions S0_ and S1_
// refer to absl::<inline namespace> and its class, whatever the namespace is called.
template <typename Fn>
Fn Real(const char* suffix) {
  const std::string ns = RISKKV_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + suffix;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

// Whether `mu` is held shared, read from its word as Abseil's TSan build does before a wait.
unsigned HeldFlags(const absl::Mutex* mu) {
  static_assert(sizeof(absl::Mutex) == sizeof(std::atomic<intptr_t>));
  constexpr intptr_t kMuWriter = 0x0008;  // absl/synchronization/mutex.cc
  const intptr_t word =
      reinterpret_cast<const std::atomic<intptr_t>*>(mu)->load(std::memory_order_relaxed);
  return (word & kMuWriter) != 0 ? 0 : __tsan_mutex_read_lock;
}

// Abseil's functions call one another through the PLT too (WaitWithTimeout calls
// WaitWithDeadline), so only the outermost of them on a thread is annotated.
thread_local int interposed_depth = 0;

class Outermost {
 public:
  Outermost() : outermost_(interposed_depth++ == 0) {}
  ~Outermost() { --interposed_depth; }
  Outermost(const Outermost&) = delete;
  Outermost& operator=(const Outermost&) = delete;
  explicit operator bool() const { return outermost_; }

 private:
  const bool outermost_;
};

// Runs `acquire` (which takes `mu`) between TSan's lock annotations; the accesses inside, such
// as evaluating a Condition, are ignored, as in Abseil's own annotations. `flags_after` gives the
// post-lock flags from acquire's result (a failed try-lock).
template <typename F, typename After>
auto Acquiring(absl::Mutex* mu, unsigned flags, F acquire, After flags_after) {
  Outermost outermost;
  if (!outermost) return acquire();
  __tsan_mutex_pre_lock(mu, flags);
  if constexpr (std::is_void_v<decltype(acquire())>) {
    acquire();
    __tsan_mutex_post_lock(mu, flags, 0);
  } else {
    const auto result = acquire();
    __tsan_mutex_post_lock(mu, flags_after(result), 0);
    return result;
  }
}

template <typename F>
auto Acquiring(absl::Mutex* mu, unsigned flags, F acquire) {
  return Acquiring(mu, flags, acquire, [flags](auto) { return flags; });
}

template <typename F>
void Releasing(absl::Mutex* mu, unsigned flags, F release) {
  Outermost outermost;
  if (!outermost) return release();
  __tsan_mutex_pre_unlock(mu, flags);
  release();
  __tsan_mutex_post_unlock(mu, flags);
}

// Runs `wait` (which releases held `mu` and takes it again) as an unlock followed by a lock, so
// the waiter is ordered after whoever held the lock meanwhile.
template <typename F>
auto Rewaiting(const absl::Mutex* held, F wait) {
  auto* mu = const_cast<absl::Mutex*>(held);
  Outermost outermost;
  if (!outermost) return wait();
  const unsigned flags = HeldFlags(mu);
  __tsan_mutex_pre_unlock(mu, flags);
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  if constexpr (std::is_void_v<decltype(wait())>) {
    wait();
    __tsan_mutex_post_lock(mu, flags, 0);
  } else {
    const auto result = wait();
    __tsan_mutex_post_lock(mu, flags, 0);
    return result;
  }
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  Acquiring(this, 0, [this] { real(this); });
}

void Mutex::ReaderLock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Acquiring(this, __tsan_mutex_read_lock, [this] { real(this); });
}

bool Mutex::TryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  return Acquiring(
      this, __tsan_mutex_try_lock, [this] { return real(this); },
      [](bool locked) { return locked ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed; });
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  return Acquiring(
      this, __tsan_mutex_try_read_lock, [this] { return real(this); },
      [](bool locked) {
        return locked ? __tsan_mutex_try_read_lock : __tsan_mutex_try_read_lock_failed;
      });
}

void Mutex::Unlock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Releasing(this, 0, [this] { real(this); });
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Releasing(this, __tsan_mutex_read_lock, [this] { real(this); });
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Acquiring(this, 0, [&] { real(this, cond); });
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Acquiring(this, __tsan_mutex_read_lock, [&] { real(this, cond); });
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Acquiring(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Acquiring(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Acquiring(this, __tsan_mutex_read_lock, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Acquiring(this, __tsan_mutex_read_lock, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(const Condition& cond) {
  static const auto real =
      Real<void (*)(Mutex*, const Condition&)>("5Mutex5AwaitERKNS0_9ConditionE");
  Rewaiting(this, [&] { real(this, cond); });
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Rewaiting(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Rewaiting(this, [&] { return real(this, cond, deadline); });
}

Mutex::~Mutex() {
  static const auto real = Real<void (*)(Mutex*)>("5MutexD2Ev");
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real(this);
}

void CondVar::Wait(Mutex* mu) {
  static const auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Rewaiting(mu, [&] { real(this, mu); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Rewaiting(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real =
      Real<bool (*)(CondVar*, Mutex*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Rewaiting(mu, [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl
