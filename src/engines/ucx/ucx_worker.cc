// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_worker.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>

#include "common/log.h"

namespace kvxfer::internal::ucx {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kWorkerFlushTimeout = std::chrono::milliseconds(500);
// The progress thread stays off the worker while a caller of progress()
// (poll) drives it, and until the caller has been away this long: two
// threads progressing one worker fight over its lock, which halved TCP
// throughput on 2 cores (a caller's progress() can itself run for ms).
constexpr std::int64_t kCallerGraceNs = 2'000'000;
// How long one progress() call may drive the worker.
constexpr std::int64_t kCallerProgressBudgetNs = 200'000;
// Without the progress thread a caller's progress() drains the worker, but a
// worker that always has more to do (a peer streaming to us) must not keep
// the caller, which holds the core's lock, forever.
constexpr std::int64_t kCallerDrainBudgetNs = 20'000'000;
// The progress thread drains the worker before sleeping; it looks at its
// stop flag and at callers at least this often.
constexpr std::int64_t kThreadDrainBudgetNs = 10'000'000;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

[[noreturn]] void fail(const char* what, ucs_status_t st) {
  throw std::runtime_error(fmt::format("kvxfer UCX: {} failed: {}", what, ucs_status_string(st)));
}

}  // namespace

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

UcxWorker::UcxWorker(std::string agent_name, const std::map<std::string, std::string>& overrides,
                     bool rma)
    : agent_name_(std::move(agent_name)) {
  ConfigHandle config;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, config.out());
  if (st != UCS_OK) fail("ucp_config_read", st);
  for (const auto& [key, value] : overrides) {
    st = ucp_config_modify(config.get(), key.c_str(), value.c_str());
    if (st != UCS_OK) {
      throw std::runtime_error(fmt::format("kvxfer UCX: engine_config {}={} rejected: {}", key,
                                           value, ucs_status_string(st)));
    }
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // Without UCP_FEATURE_RMA, UCP installs no software put/get handlers: no
  // message a peer sends makes this worker write an address it names.
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : 0);
  params.name = agent_name_.c_str();
  st = ucp_init(&params, config.get(), context_.out());
  if (st != UCS_OK) {
    *context_.out() = nullptr;
    fail("ucp_init", st);
  }

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_MULTI;
  st = ucp_worker_create(context_.get(), &wparams, worker_.out());
  if (st != UCS_OK) {
    *worker_.out() = nullptr;
    fail("ucp_worker_create", st);
  }
  ucp_worker_attr_t wattr{};
  wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS |
                     UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  st = ucp_worker_query(worker_.get(), &wattr);
  if (st != UCS_OK) fail("ucp_worker_query", st);
  const std::span<const std::uint8_t> address(reinterpret_cast<const std::uint8_t*>(wattr.address),
                                              wattr.address_length);
  address_.assign(address.begin(), address.end());
  ucp_worker_release_address(worker_.get(), wattr.address);
  max_am_header_ = wattr.max_am_header;
  // The progress thread and the callers' threads share the worker.
  if (wattr.thread_mode != UCS_THREAD_MODE_MULTI) {
    throw std::runtime_error("kvxfer UCX: this UCX build has no UCS_THREAD_MODE_MULTI workers");
  }
}

void UcxWorker::set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t hparams{};
  hparams.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  hparams.id = id;
  hparams.cb = cb;
  hparams.arg = arg;
  const ucs_status_t st = ucp_worker_set_am_recv_handler(worker_.get(), &hparams);
  if (st != UCS_OK) fail("setting an active message handler", st);
}

// UCX 1.13 asserts (and aborts the process) in ucp_worker_destroy when a
// wireup message, e.g. the reply to a peer that just connected, is still
// pending on a TCP endpoint UCX created for that peer ("got REP message" in
// the pending purge; the assertion was dropped upstream in 2022). Flushing the
// worker first sends or fails those messages. Bounded: a dead peer must not
// hold up close().
void UcxWorker::flush_before_destroy() {
  ucp_request_param_t param{};
  void* request = ucp_worker_flush_nbx(worker_.get(), &param);
  if (request == nullptr) return;
  if (UCS_PTR_IS_ERR(request)) {
    log().debug("kvxfer UCX {}: worker flush before destroy: {}", agent_name_,
                ucs_status_string(UCS_PTR_STATUS(request)));
    return;
  }
  const auto deadline = Clock::now() + kWorkerFlushTimeout;
  while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) {
    ucp_worker_progress(worker_.get());
  }
  if (ucp_request_check_status(request) == UCS_INPROGRESS) {
    log().debug("kvxfer UCX {}: worker flush before destroy did not finish in time", agent_name_);
  }
  ucp_request_free(request);
}

void UcxWorker::destroy() {
  stop_progress_thread();
  // Destroying the worker completes whatever UCX still holds with
  // UCS_ERR_CANCELED, which returns the last transfer handles to the pool.
  if (worker_) {
    flush_before_destroy();
    worker_.reset();
  }
  context_.reset();
}

// ---------------------------------------------------------------------------
// Progress thread
// ---------------------------------------------------------------------------

void UcxWorker::start_progress_thread(std::optional<int> nice) {
  int worker_fd = -1;
  const ucs_status_t st = ucp_worker_get_efd(worker_.get(), &worker_fd);
  if (st != UCS_OK) fail("ucp_worker_get_efd", st);
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (epoll_fd_.get() < 0 || wake_fd_.get() < 0) {
    throw std::runtime_error(fmt::format("kvxfer UCX: epoll/eventfd: {}", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = worker_fd;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, worker_fd, &ev) != 0) {
    throw std::runtime_error(fmt::format("kvxfer UCX: epoll_ctl: {}", std::strerror(errno)));
  }
  ev.data.fd = wake_fd_.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) {
    throw std::runtime_error(fmt::format("kvxfer UCX: epoll_ctl: {}", std::strerror(errno)));
  }
  stop_.store(false);
  thread_ = std::thread([this, nice] {
    set_progress_priority(nice);
    progress_loop();
  });
}

// On the progress thread, first thing. The name lets an operator find the
// thread (top -H, chrt, renice); the nice value applies to this thread only.
void UcxWorker::set_progress_priority(std::optional<int> nice) {
  static_cast<void>(::pthread_setname_np(::pthread_self(), "kvxfer-progress"));
  // Naps and linger steps end on time: the kernel's default slack (50 us)
  // would double a linger step, and a post waiting in it (docs/ucx-engine.md).
  static_cast<void>(::prctl(PR_SET_TIMERSLACK, kTimerSlackNs, 0, 0, 0));
  if (!nice) return;
  const auto tid = static_cast<id_t>(::gettid());
  if (::setpriority(PRIO_PROCESS, tid, *nice) != 0) {
    const int err = errno;
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, tid);
    log().warn(
        "kvxfer UCX {}: cannot set the progress thread's nice value to {}: {} (a value below "
        "the current one needs CAP_SYS_NICE or RLIMIT_NICE); it stays at {}",
        agent_name_, *nice, std::strerror(err), errno == 0 ? now : 0);
    return;
  }
  log().debug("kvxfer UCX {}: progress thread at nice {}", agent_name_, *nice);
}

void UcxWorker::progress_loop() {
  // Sleeps until the worker has something to do: a spinning progress thread
  // costs 2-3x throughput when cores are few.
  std::array<epoll_event, 4> events{};
  while (!stop_.load(std::memory_order_acquire)) {
    const std::int64_t since_caller =
        callers_progressing_.load(std::memory_order_relaxed) > 0
            ? 0
            : now_ns() - caller_progress_ns_.load(std::memory_order_relaxed);
    if (since_caller < kCallerGraceNs) {
      // A caller is driving the worker: wait (for stop, or until the caller
      // has been away a grace period) without touching it.
      pollfd wake{wake_fd_.get(), POLLIN, 0};
      const auto wait_ms = static_cast<int>((kCallerGraceNs - since_caller + 999'999) / 1'000'000);
      if (::poll(&wake, 1, std::max(wait_ms, 1)) > 0) drain_wake_fd();
      continue;
    }
    bool active = submit_hook_ && submit_hook_(false) == Rest::kGoRound;
    const std::int64_t start = now_ns();
    bool busy = false;
    for (unsigned n = 1; ucp_worker_progress(worker_.get()) != 0; ++n) {
      active = true;
      if (n % 8 == 0 && now_ns() - start > kThreadDrainBudgetNs) {
        busy = true;
        break;
      }
    }
    if (active) quiet_naps_ = 0;
    if (active || !worker_woke_) {
      empty_wakeups_ = 0;
    } else if (empty_wakeups_ < kMaxEmptyWakeups) {
      ++empty_wakeups_;
    }
    if (busy) continue;  // more to do: look at stop and callers, then go on
    const ucs_status_t st = ucp_worker_arm(worker_.get());
    if (st == UCS_ERR_BUSY) continue;  // events arrived meanwhile
    // Submissions that came while we progressed, or after the arm: go round
    // again instead of sleeping on them.
    const Rest rest = submit_hook_ ? submit_hook_(true) : Rest::kSleep;
    if (rest == Rest::kGoRound) continue;
    if (empty_wakeups_ >= kMaxEmptyWakeups) {
      // The worker's fd keeps waking us for nothing its progress can do
      // (UCX 1.13: an endpoint whose peer has not taken the connection yet
      // reports EPOLLOUT at every look), and the thread would spin a core
      // for as long as the peer stays silent. Wait on our own fd alone for a
      // while instead, then look again; any progress ends this.
      pollfd wake{wake_fd_.get(), POLLIN, 0};
      const timespec backoff{0, kEmptyWakeupBackoffNs};
      if (::ppoll(&wake, 1, &backoff, nullptr) > 0) drain_wake_fd();
      continue;  // worker_woke_ stays: still idle unless the next round works
    }
    // An arm failure would make the fd useless; fall back to a slow poll.
    std::chrono::nanoseconds timeout{-1};
    if (st != UCS_OK) {
      timeout = std::chrono::milliseconds(1);
    } else if (rest == Rest::kNap) {
      timeout = nap_;
    } else if (rest == Rest::kLinger) {
      timeout = linger_step_;
    }
    const int n = wait_events(events, timeout);
    if (rest == Rest::kNap) quiet_naps_ = n == 0 ? quiet_naps_ + 1 : 0;
    worker_woke_ = false;
    for (int i = 0; i < n; ++i) {
      if (events[static_cast<std::size_t>(i)].data.fd == wake_fd_.get()) {
        drain_wake_fd();
      } else {
        worker_woke_ = true;
      }
    }
  }
}

// epoll_pwait2 takes the nap to the microsecond; a kernel without it (before
// 5.11) gets epoll_wait's milliseconds, rounded up.
int UcxWorker::wait_events(std::span<epoll_event> events, std::chrono::nanoseconds timeout) {
  const auto max = static_cast<int>(events.size());
  if (timeout.count() < 0) return ::epoll_wait(epoll_fd_.get(), events.data(), max, -1);
  if (pwait2_) {
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(timeout);
    const timespec ts{static_cast<time_t>(secs.count()),
                      static_cast<long>((timeout - secs).count())};
    const int n = ::epoll_pwait2(epoll_fd_.get(), events.data(), max, &ts, nullptr);
    if (n >= 0 || errno != ENOSYS) return n;
    pwait2_ = false;
  }
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(timeout);
  return ::epoll_wait(epoll_fd_.get(), events.data(), max, static_cast<int>(ms.count()));
}

void UcxWorker::drain_wake_fd() {
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t r = ::read(wake_fd_.get(), &count, sizeof(count));
}

void UcxWorker::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_fd_.get(), &one, sizeof(one));
}

void UcxWorker::stop_progress_thread() {
  if (thread_.joinable()) {
    stop_.store(true, std::memory_order_release);
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
  epoll_fd_.reset();
  wake_fd_.reset();
}

void UcxWorker::progress_from_caller() {
  if (!worker_) return;
  if (!thread_.joinable()) {
    const std::int64_t start = now_ns();
    for (unsigned n = 1; ucp_worker_progress(worker_.get()) != 0; ++n) {
      if (n % 8 == 0 && now_ns() - start > kCallerDrainBudgetNs) break;
    }
    return;
  }
  callers_progressing_.fetch_add(1, std::memory_order_relaxed);
  // Bounded: the core holds its lock around this, and a busy worker always
  // has more to do; the next poll() goes on.
  const std::int64_t start = now_ns();
  std::int64_t end = start;
  for (unsigned n = 1; ucp_worker_progress(worker_.get()) != 0; ++n) {
    if (n % 8 == 0 && (end = now_ns()) - start > kCallerProgressBudgetNs) break;
  }
  caller_progress_ns_.store(std::max(end, now_ns()), std::memory_order_relaxed);
  callers_progressing_.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace kvxfer::internal::ucx
