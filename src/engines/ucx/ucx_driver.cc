// SPDX-License-Identifier: Apache-2.0
#include "engines/ucx/ucx_driver.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "common/log.h"

namespace kvxfer::internal::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// The progress thread looks at its queue and stop flag at least this often
// while the worker has more to do.
constexpr auto kThreadBudget = std::chrono::milliseconds(2);
constexpr auto kWorkerFlushTimeout = std::chrono::milliseconds(500);
// UCX 1.13 reports a tcp endpoint whose peer has not taken the connection
// yet as ready at every look: after this many wake-ups in a row that found
// nothing to do, the thread waits on its own fd alone for a millisecond.
constexpr int kMaxEmptyWakeups = 64;

[[noreturn]] void fail(const char* what, ucs_status_t st) {
  throw std::runtime_error(fmt::format("kvxfer ucx: {} failed: {}", what, ucs_status_string(st)));
}

std::uint64_t this_thread_id() {
  static thread_local const auto id = static_cast<std::uint64_t>(::gettid());
  return id;
}

}  // namespace

bool UcxTurn::here() const { return inside_.load(std::memory_order_acquire) == this_thread_id(); }

void UcxTurn::enter() {
  if (inside_.exchange(this_thread_id(), std::memory_order_acq_rel) != 0) count_overlap();
}

// Holds the turn for a scope.
class SCOPED_CAPABILITY UcxDriver::Turn {
 public:
  explicit Turn(UcxTurn& turn) ACQUIRE(turn) : turn_(turn) { turn_.acquire(); }
  ~Turn() RELEASE() { turn_.release(); }
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;

 private:
  UcxTurn& turn_;
};

UcxDriver::UcxDriver(std::string agent_name, const std::map<std::string, std::string>& overrides)
    : agent_name_(std::move(agent_name)) {
  ConfigHandle config;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, config.out());
  if (st != UCS_OK) fail("ucp_config_read", st);
  for (const auto& [key, value] : overrides) {
    if ((st = ucp_config_modify(config.get(), key.c_str(), value.c_str())) != UCS_OK) {
      throw std::runtime_error(fmt::format("kvxfer ucx: engine_config {}={} rejected: {}", key,
                                           value, ucs_status_string(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.name = agent_name_.c_str();
  if ((st = ucp_init(&params, config.get(), context_.out())) != UCS_OK) {
    *context_.out() = nullptr;
    fail("ucp_init", st);
  }
  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if ((st = ucp_worker_create(context_.get(), &wparams, worker_.out())) != UCS_OK) {
    *worker_.out() = nullptr;
    fail("ucp_worker_create", st);
  }
  ucp_worker_attr_t attr{};
  attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
  if ((st = ucp_worker_query(worker_.get(), &attr)) != UCS_OK) fail("ucp_worker_query", st);
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(attr.address);
  address_.assign(bytes, bytes + attr.address_length);
  ucp_worker_release_address(worker_.get(), attr.address);
}

void UcxDriver::set_am_handler(unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t params{};
  params.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
  params.id = id;
  params.cb = cb;
  params.arg = arg;
  const ucs_status_t st = ucp_worker_set_am_recv_handler(worker_.get(), &params);
  if (st != UCS_OK) fail("setting an active message handler", st);
}

bool UcxDriver::check_turn() {
  if (turn_.here()) return true;
  if (turn_.count_overlap()) {
    log().error("kvxfer ucx {}: a thread without the driver's turn is inside the worker",
                agent_name_);
  }
  return false;
}

void UcxDriver::submit(Command command) {
  bool wake_thread = false;
  {
    MutexLock lock(mu_);
    queue_.push_back(command);
    queued_.store(true, std::memory_order_relaxed);
    wake_thread = std::exchange(idle_, false);
  }
  if (wake_thread) {
    wakes_.fetch_add(1, std::memory_order_relaxed);
    wake();
  }
}

void UcxDriver::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_fd_, &one, sizeof(one));
}

bool UcxDriver::run_queue() {
  {
    MutexLock lock(mu_);
    idle_ = false;
    queued_.store(false, std::memory_order_relaxed);
    if (queue_.empty()) return false;
    running_.swap(queue_);
  }
  for (const Command& c : running_) c.run(c.arg);
  running_.clear();
  return true;
}

bool UcxDriver::drive(std::chrono::nanoseconds budget) {
  {
    MutexLock lock(mu_);
    if (thread_running_ || !worker_) return false;
  }
  if (!turn_.try_acquire()) return false;
  run_queue();
  const auto end = Clock::now() + budget;
  for (unsigned n = 1; ucp_worker_progress(worker_.get()) != 0; ++n) {
    if (n % 8 == 0 && Clock::now() > end) break;
  }
  turn_.release();
  return true;
}

void UcxDriver::start_thread() {
  int worker_fd = -1;
  const ucs_status_t st = ucp_worker_get_efd(worker_.get(), &worker_fd);
  if (st != UCS_OK) fail("ucp_worker_get_efd", st);
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (const int fd : {worker_fd, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_fd_ < 0 || wake_fd_ < 0 || ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      throw std::runtime_error(fmt::format("kvxfer ucx: epoll: {}", std::strerror(errno)));
    }
  }
  {
    MutexLock lock(mu_);
    stop_ = false;
    thread_running_ = true;
  }
  thread_ = std::thread([this] {
    static_cast<void>(::pthread_setname_np(::pthread_self(), "kvxfer-ucx"));
    loop();
  });
}

void UcxDriver::loop() {
  std::array<epoll_event, 2> events{};
  int empty_wakeups = 0;
  bool worker_woke = false;
  for (;;) {
    bool worked = false;
    bool busy = false;
    ucs_status_t armed = UCS_OK;
    {
      Turn turn(turn_);
      worked = run_queue();
      const auto end = Clock::now() + kThreadBudget;
      for (unsigned n = 1; ucp_worker_progress(worker_.get()) != 0; ++n) {
        worked = true;
        // Commands wait for at most a few progress calls, not the budget.
        if (n % 8 == 0 && (queued_.load(std::memory_order_relaxed) || Clock::now() > end)) {
          busy = true;
          break;
        }
      }
      if (!busy) armed = ucp_worker_arm(worker_.get());
    }
    empty_wakeups = worked || !worker_woke ? 0 : empty_wakeups + 1;
    {
      MutexLock lock(mu_);
      if (stop_) return;
      // More to do, events since the arm, or commands: go round.
      if (busy || armed == UCS_ERR_BUSY || !queue_.empty()) continue;
      idle_ = true;
    }
    std::uint64_t drained = 0;
    if (empty_wakeups >= kMaxEmptyWakeups) {
      pollfd own{wake_fd_, POLLIN, 0};
      const timespec backoff{0, 1'000'000};
      if (::ppoll(&own, 1, &backoff, nullptr) > 0) {
        [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &drained, sizeof(drained));
      }
      continue;  // worker_woke stays: idle unless the next round works
    }
    // An arm that failed leaves the fd useless: poll every millisecond.
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()),
                               armed == UCS_OK ? -1 : 1);
    worker_woke = false;
    for (int i = 0; i < n; ++i) {
      if (events[static_cast<std::size_t>(i)].data.fd != wake_fd_) {
        worker_woke = true;
      } else {
        [[maybe_unused]] const ssize_t r = ::read(wake_fd_, &drained, sizeof(drained));
      }
    }
  }
}

void UcxDriver::stop_thread() {
  if (thread_.joinable()) {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    wake();
    thread_.join();
  }
  {
    MutexLock lock(mu_);
    thread_running_ = false;
    idle_ = false;
  }
  done_cv_.notify_all();  // waiters now take turns themselves
}

void UcxDriver::destroy() {
  stop_thread();
  if (worker_) {
    Turn turn(turn_);
    run_queue();
    // UCX 1.13 asserts in ucp_worker_destroy when a wireup message (the
    // reply to a peer that just connected) is still pending: a flush first
    // sends or fails it. Bounded: a dead peer must not hold up close().
    ucp_request_param_t param{};
    void* request = ucp_worker_flush_nbx(worker_.get(), &param);
    if (UCS_PTR_IS_PTR(request)) {
      const auto deadline = Clock::now() + kWorkerFlushTimeout;
      while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < deadline) {
        ucp_worker_progress(worker_.get());
      }
      ucp_request_free(request);
    }
    worker_.reset();  // completes what UCX still holds with UCS_ERR_CANCELED
  }
  context_.reset();
  for (int* fd : {&epoll_fd_, &wake_fd_}) {
    if (*fd >= 0) ::close(std::exchange(*fd, -1));
  }
}

}  // namespace kvxfer::internal::ucx
