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

#include "engines/ucx/ucx_handles.h"

namespace kvxfer::internal::ucx {

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
  [[nodiscard]] ucp_worker_h worker() const { return worker_.get(); }  // inside a turn
  [[nodiscard]] const std::vector<std::uint8_t>& address() const { return address_; }
  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg);  // before start

  void start_thread();  // named kvxfer-ucx
  void stop_thread();   // from here waiters and poll() take the turns

  // Queues a command; wakes the progress thread if it sleeps.
  void submit(Command command);
  // A turn when no progress thread runs: runs the queue, then progresses
  // the worker until it is idle or `budget` passed. False (and nothing
  // done) when the thread runs or another thread has the turn.
  bool drive(std::chrono::nanoseconds budget);
  // Waits until done() (read under the driver's lock) or `deadline`,
  // driving meanwhile when no thread does; whoever makes done() true does
  // it through finish(). True when done.
  template <typename Done>
  bool wait(Done done, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mu_);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      if (thread_running_) {
        done_cv_.wait_until(lock, deadline);
        continue;
      }
      lock.unlock();
      static_cast<void>(drive(std::chrono::milliseconds(1)));
      lock.lock();
      // UCX waits on the peer, or another thread has the turn.
      if (!done()) done_cv_.wait_for(lock, std::chrono::microseconds(100));
    }
    return done();
  }
  template <typename Set>
  void finish(Set set) {
    {
      std::lock_guard lock(mu_);
      set();
    }
    done_cv_.notify_all();
  }

  // Whether this thread has the turn; counts an overlap when not.
  bool check_turn();
  [[nodiscard]] std::uint64_t overlaps() const { return overlaps_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t wakes() const { return wakes_.load(std::memory_order_relaxed); }

  // Stops the thread, runs what is queued, flushes the worker (bounded) and
  // destroys it and the context. Idempotent.
  void destroy();

 private:
  class Turn;
  void loop();
  bool run_queue();  // inside a turn; true if a command ran
  void wake();

  std::string agent_name_;
  ContextHandle context_;
  WorkerHandle worker_;
  std::vector<std::uint8_t> address_;

  // The queue, the thread's sleep and the waits' done flags.
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::vector<Command> queue_;
  std::vector<Command> running_;  // inside a turn only
  bool thread_running_ = false;
  bool idle_ = false;  // the thread sleeps, or is about to: submit() wakes it
  bool stop_ = false;
  std::atomic<bool> queued_{false};  // the queue has commands (a hint)

  std::mutex turn_mu_;
  std::atomic<std::uint64_t> inside_{0};  // the turn's thread id; 0: none
  std::atomic<std::uint64_t> overlaps_{0};
  std::atomic<std::uint64_t> wakes_{0};
  std::thread thread_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
};

}  // namespace kvxfer::internal::ucx
