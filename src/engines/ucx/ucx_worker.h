// The UCX context and the one worker the lane drives, and who drives it: the
// progress thread (sleeping on the worker's event fd) or a polling caller,
// never both at once.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
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

  // Work the progress thread runs for its owner (the lane's queued sends):
  // called at the top of every round with `before_sleep` false, and once more
  // after the worker is armed with `before_sleep` true, when it returns
  // whether the thread may sleep (false: it found work, go round again). Set
  // before start_progress_thread().
  void set_submit_hook(std::function<bool(bool before_sleep)> hook) {
    submit_hook_ = std::move(hook);
  }
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

  std::string agent_name_;
  ContextHandle context_;
  WorkerHandle worker_;
  std::vector<std::uint8_t> address_;
  std::size_t max_am_header_ = 0;

  // Progress thread: sleeps in epoll on the worker's event fd and wake_fd_.
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::function<bool(bool)> submit_hook_;
  // Callers of progress_from_caller() driving the worker now, and
  // steady_clock ns of the last such call's end.
  std::atomic<int> callers_progressing_{0};
  std::atomic<std::int64_t> caller_progress_ns_{std::numeric_limits<std::int64_t>::min() / 2};
  Fd epoll_fd_;
  Fd wake_fd_;
};

}  // namespace kvxfer::internal::ucx
