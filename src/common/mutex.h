// SPDX-License-Identifier: Apache-2.0
// A std::mutex that clang's thread-safety analysis knows as a lock (libstdc++'s
// carries no annotations), the guard that holds it for a scope, and a
// run-time check for what the analysis cannot follow: a call that may wait
// (an engine's connect, disconnect or shutdown) must not run under the lock,
// whatever path led to it. Uses nothing of kvxfer's but the logger. The
// check costs the lock about 3 ns (an owner stored on lock and unlock).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/log.h"
#include "common/thread_annotations.h"

namespace kvxfer::internal {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() ACQUIRE() {
    mu_.lock();
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  void unlock() RELEASE() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    mu_.unlock();
  }

  // A call that may wait, or runs code that is not ours, is about to run:
  // this thread must not hold the lock. Only the thread that holds it
  // stores its own id in owner_, so the relaxed load is exact for the
  // calling thread. A bug when it fires: logged as an error, and fatal in
  // builds with assertions (the sanitizer stages).
  void assert_not_held(const char* what) const {
    if (owner_.load(std::memory_order_relaxed) == std::this_thread::get_id()) held_by_mistake(what);
  }

 private:
  friend class MutexLock;

  [[gnu::cold, gnu::noinline]] static void held_by_mistake(const char* what) {
    log().error("kvxfer: {} runs under a lock that nothing which can wait may hold (a bug)", what);
#if !defined(NDEBUG)
    std::fprintf(stderr, "kvxfer: %s runs under a lock it must not run under\n", what);
    std::abort();
#endif
  }

  std::mutex mu_;
  std::atomic<std::thread::id> owner_{};
};

// Holds a Mutex from construction to destruction, with unlock() and lock()
// in between for a stretch that must run without it.
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() RELEASE() {
    mu_.unlock();
    held_ = false;
  }
  void lock() ACQUIRE() {
    mu_.lock();
    held_ = true;
  }

  // Releases the lock until `cv` is notified (or wakes spuriously: callers
  // loop on their condition), then holds it again.
  void wait(std::condition_variable& cv) {
    std::unique_lock<std::mutex> lock = adopt();
    cv.wait(lock);
    readopt(lock);
  }
  // The same, until `deadline` at the latest; false once it has passed.
  bool wait_until(std::condition_variable& cv, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock = adopt();
    const bool woken = cv.wait_until(lock, deadline) == std::cv_status::no_timeout;
    readopt(lock);
    return woken;
  }

 private:
  // A std::unique_lock on the held std::mutex for a condition variable's
  // wait, which releases it; no owner meanwhile.
  std::unique_lock<std::mutex> adopt() {
    mu_.owner_.store(std::thread::id(), std::memory_order_relaxed);
    return std::unique_lock<std::mutex>(mu_.mu_, std::adopt_lock);
  }
  void readopt(std::unique_lock<std::mutex>& lock) {
    lock.release();
    mu_.owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }

  Mutex& mu_;
  bool held_ = true;
};

}  // namespace kvxfer::internal
