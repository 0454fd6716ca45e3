// SPDX-License-Identifier: Apache-2.0
// The UCX context and the one worker the lane drives, and who drives it: the
// progress thread (sleeping on the worker's event fd) or a polling caller,
// never both at once.
#pragma once

#include <sys/epoll.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engines/ucx/ucx_handles.h"

namespace kvxfer::internal::ucx {

// A file descriptor closed on destruction.
class Fd {
 public:
  Fd() = default;
  ~Fd() { reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  void reset(int fd = -1);
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_ = -1;
};

class UcxWorker {
 public:
  // Reads UCX's configuration, applies `overrides` (ucp_config_modify keys),
  // creates the context (AM, wakeup, and RMA only when `rma`) and a
  // multi-threaded worker. Throws std::runtime_error when any step fails.
  UcxWorker(std::string agent_name, const std::map<std::string, std::string>& overrides, bool rma);
  ~UcxWorker() { destroy(); }
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  [[nodiscard]] ucp_context_h context() const { return context_.get(); }
  [[nodiscard]] ucp_worker_h worker() const { return worker_.get(); }
  // The worker's address, for peers to connect to.
  [[nodiscard]] const std::vector<std::uint8_t>& address() const { return address_; }
  [[nodiscard]] std::size_t max_am_header() const { return max_am_header_; }

  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg);

  // What the progress thread does once the worker is armed and its owner's
  // work is done: go round again (work came in), sleep until an event of the
  // worker or wake(), or nap: the same, but for at most the nap given to
  // set_submit_hook, so that submissions need no wake() meanwhile.
  // kLinger: the same with the linger step given to set_submit_hook (the
  // lane was busy a moment ago and may be again soon).
  enum class Rest { kGoRound, kSleep, kNap, kLinger };
  // Work the progress thread runs for its owner (the lane's queued sends):
  // called at the top of every round with `before_sleep` false, when it
  // returns kGoRound if it found work (anything else if not); and once more
  // after the worker is armed with `before_sleep` true, when it says how
  // the thread rests. Set before start_progress_thread().
  void set_submit_hook(std::function<Rest(bool before_sleep)> hook, std::chrono::nanoseconds nap,
                       std::chrono::nanoseconds linger_step = std::chrono::nanoseconds{0}) {
    submit_hook_ = std::move(hook);
    nap_ = nap;
    linger_step_ = linger_step;
  }
  // Naps in a row that ended with no event and no work after them: a peer
  // whose requests are in flight but silent (stalled, or gone without an
  // error yet). From kMaxQuietNaps on, the hook should say kSleep: a nap
  // then only costs CPU (about 10% of a core here at 200 us). On the
  // progress thread only (the hook runs there).
  static constexpr int kMaxQuietNaps = 4;
  // The progress thread's timer slack (PR_SET_TIMERSLACK), in ns.
  static constexpr unsigned long kTimerSlackNs = 1000;
  [[nodiscard]] bool naps_unanswered() const { return quiet_naps_ >= kMaxQuietNaps; }
  // Wakes the progress thread from its sleep (for new submissions).
  void wake();

  // The thread names itself kvxfer-progress and, with `nice`, sets its own
  // nice value (a value it may not take is logged, and it runs on as it is).
  void start_progress_thread(std::optional<int> nice = std::nullopt);
  void stop_progress_thread();
  [[nodiscard]] bool progress_thread_running() const { return thread_.joinable(); }

  // A polling caller's turn: with the progress thread on, drives the worker
  // for at most kCallerProgressBudgetNs and keeps the thread off it for a
  // grace period; with it off, progresses until the worker is idle or
  // kCallerDrainBudgetNs passed.
  void progress_from_caller();
  // One ucp_worker_progress, for loops that wait on UCX.
  unsigned progress_once() { return ucp_worker_progress(worker_.get()); }

  // Stops the thread, flushes the worker (bounded), destroys the worker and
  // the context. Idempotent.
  void destroy();

 private:
  void progress_loop();
  void set_progress_priority(std::optional<int> nice);
  void flush_before_destroy();
  // Empties wake_fd_ after it woke a wait.
  void drain_wake_fd();
  // epoll_wait on epoll_fd_ for at most `timeout` (negative: no limit).
  int wait_events(std::span<epoll_event> events, std::chrono::nanoseconds timeout);

  std::string agent_name_;
  ContextHandle context_;
  WorkerHandle worker_;
  std::vector<std::uint8_t> address_;
  std::size_t max_am_header_ = 0;

  // Progress thread: sleeps in epoll on the worker's event fd and wake_fd_.
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::function<Rest(bool)> submit_hook_;
  std::chrono::nanoseconds nap_{0};
  std::chrono::nanoseconds linger_step_{0};
  bool pwait2_ = true;  // the kernel has epoll_pwait2 (on the thread only)
  int quiet_naps_ = 0;  // naps_unanswered() (on the thread only)
  // Rounds in a row that the worker's fd woke the thread for and that found
  // nothing to do (on the thread only): from kMaxEmptyWakeups on, the thread
  // waits kEmptyWakeupBackoffNs on its own fd alone between rounds, instead
  // of spinning on an fd that stays ready (progress_loop).
  static constexpr int kMaxEmptyWakeups = 64;
  static constexpr long kEmptyWakeupBackoffNs = 1'000'000;
  int empty_wakeups_ = 0;
  bool worker_woke_ = false;
  // Callers of progress_from_caller() driving the worker now, and
  // steady_clock ns of the last such call's end.
  std::atomic<int> callers_progressing_{0};
  std::atomic<std::int64_t> caller_progress_ns_{std::numeric_limits<std::int64_t>::min() / 2};
  Fd epoll_fd_;
  Fd wake_fd_;
};

}  // namespace kvxfer::internal::ucx
