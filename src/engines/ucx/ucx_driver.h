// SPDX-License-Identifier: Apache-2.0
// The UCX context, its one worker, and the one thread at a time that drives
// them. After start-up every call into UCX (posts, flushes, endpoint
// creation and close, progress) runs as a command on the driver's queue,
// and every UCX callback runs inside a driver's turn:
// - with the progress thread (the default), the thread alone takes turns:
//   it runs the queue, progresses the worker, and sleeps on the worker's
//   event fd and its own wake fd; other threads enqueue (and, for connect
//   and disconnect, wait);
// - without it (Options::progress_thread=false, and from stop() on), a turn
//   is taken by poll() or by a thread waiting for its command, whichever
//   comes first.
// A turn is a mutex, never held with the transport's lock, so no UCX
// callback runs under that lock. The worker is UCS_THREAD_MODE_SERIALIZED.
// A turn records its thread and the lane's callbacks check it: a call from
// another thread counts in overlaps() (engine counter ucx_driver_overlaps).
// The turn is also a capability the compiler checks (UcxTurn): what needs
// it says REQUIRES(driver.turn()).
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engines/ucx/ucx_handles.h"

namespace kvxfer::internal::ucx {

// The driver's turn: one thread at a time inside the worker. A capability
// for clang's analysis, so that a function that calls into UCX, or touches
// what only the driver touches, says REQUIRES(turn) and its callers are
// checked. Taken by the driver alone (UcxDriver's loop, drive(), destroy());
// a command or callback, which UCX or the driver runs inside a turn, says
// so with UcxDriver::check_turn().
class CAPABILITY("ucx turn") UcxTurn {
 public:
  void acquire() ACQUIRE() {
    mu_.lock();
    enter();
  }
  bool try_acquire() TRY_ACQUIRE(true) {
    if (!mu_.try_lock()) return false;
    enter();
    return true;
  }
  void release() RELEASE() {
    inside_.store(0, std::memory_order_release);
    mu_.unlock();
  }
  // Whether the calling thread has the turn.
  [[nodiscard]] bool here() const;
  // A thread without the turn was inside the worker: counts it; true for
  // the first.
  bool count_overlap() { return overlaps_.fetch_add(1, std::memory_order_relaxed) == 0; }
  [[nodiscard]] std::uint64_t overlaps() const { return overlaps_.load(std::memory_order_relaxed); }

 private:
  void enter();  // records the thread; another one inside counts an overlap

  std::mutex mu_;
  std::atomic<std::uint64_t> inside_{0};  // the turn's thread id; 0: none
  std::atomic<std::uint64_t> overlaps_{0};
};

class UcxDriver {
 public:
  struct Command {  // run(arg), inside a turn
    void (*run)(void* arg) = nullptr;
    void* arg = nullptr;
  };

  // Creates the context (AM, RMA, wakeup; `overrides` are ucp_config_modify
  // keys) and the worker. Throws std::runtime_error when a step fails.
  UcxDriver(std::string agent_name, const std::map<std::string, std::string>& overrides);
  ~UcxDriver() { destroy(); }
  UcxDriver(const UcxDriver&) = delete;
  UcxDriver& operator=(const UcxDriver&) = delete;

  [[nodiscard]] ucp_context_h context() const { return context_.get(); }
  [[nodiscard]] ucp_worker_h worker() const REQUIRES(turn_) { return worker_.get(); }
  // Whether the worker exists (until destroy()).
  [[nodiscard]] bool has_worker() const { return worker_.get() != nullptr; }
  // The turn, for REQUIRES and GUARDED_BY of what needs it.
  UcxTurn& turn() RETURN_CAPABILITY(turn_) { return turn_; }
  [[nodiscard]] const std::vector<std::uint8_t>& address() const { return address_; }
  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg);  // before start

  void start_thread() EXCLUDES(mu_);  // named kvxfer-ucx
  void stop_thread() EXCLUDES(mu_);   // from here waiters and poll() take the turns

  // Queues a command; wakes the progress thread if it sleeps.
  void submit(Command command) EXCLUDES(mu_);
  // A turn when no progress thread runs: runs the queue, then progresses
  // the worker until it is idle or `budget` passed. False (and nothing
  // done) when the thread runs or another thread has the turn.
  bool drive(std::chrono::nanoseconds budget) EXCLUDES(mu_, turn_);
  // Waits until done() (read under the driver's lock) or `deadline`,
  // driving meanwhile when no thread does; whoever makes done() true does
  // it through finish(). True when done.
  // (The flags done() reads are the callers': the analysis cannot follow
  // the driver's lock into their lambdas, so they say "under the driver's
  // lock" in words.) Never in a turn: the turn would wait on itself.
  template <typename Done>
  bool wait(Done done, std::chrono::steady_clock::time_point deadline) EXCLUDES(mu_, turn_) {
    MutexLock lock(mu_);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      if (thread_running_) {
        lock.wait_until(done_cv_, deadline);
        continue;
      }
      lock.unlock();
      static_cast<void>(drive(std::chrono::milliseconds(1)));
      lock.lock();
      // UCX waits on the peer, or another thread has the turn.
      if (!done()) {
        lock.wait_until(done_cv_,
                        std::chrono::steady_clock::now() + std::chrono::microseconds(100));
      }
    }
    return done();
  }
  template <typename Set>
  void finish(Set set) EXCLUDES(mu_) {
    {
      MutexLock lock(mu_);
      set();
    }
    done_cv_.notify_all();
  }

  // Whether this thread has the turn; counts an overlap when not. The
  // analysis takes the turn as held from here on: commands and callbacks,
  // which only a turn runs, start with it, and a call from any other thread
  // shows in overlaps() (asserted 0 by the tests).
  bool check_turn() ASSERT_CAPABILITY(turn_);
  [[nodiscard]] std::uint64_t overlaps() const { return turn_.overlaps(); }
  [[nodiscard]] std::uint64_t wakes() const { return wakes_.load(std::memory_order_relaxed); }

  // Stops the thread, runs what is queued, flushes the worker (bounded) and
  // destroys it and the context. Idempotent.
  void destroy() EXCLUDES(mu_, turn_);

 private:
  class Turn;
  void loop() EXCLUDES(mu_, turn_);
  bool run_queue() REQUIRES(turn_) EXCLUDES(mu_);  // true if a command ran
  void wake();

  std::string agent_name_;
  ContextHandle context_;
  WorkerHandle worker_;
  std::vector<std::uint8_t> address_;

  // The queue, the thread's sleep and the waits' done flags.
  // Taken alone, or inside a turn (never a turn inside it).
  Mutex mu_ ACQUIRED_AFTER(turn_);
  std::condition_variable done_cv_;
  std::vector<Command> queue_ GUARDED_BY(mu_);
  std::vector<Command> running_ GUARDED_BY(turn_);
  bool thread_running_ GUARDED_BY(mu_) = false;
  // The thread sleeps, or is about to: submit() wakes it.
  bool idle_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  std::atomic<bool> queued_{false};  // the queue has commands (a hint)

  UcxTurn turn_;
  std::atomic<std::uint64_t> wakes_{0};
  std::thread thread_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
};

}  // namespace kvxfer::internal::ucx
