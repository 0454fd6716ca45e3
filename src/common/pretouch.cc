// SPDX-License-Identifier: Apache-2.0
#include "common/pretouch.h"

#include <fmt/format.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace kvxfer::internal {
namespace {

using Clock = std::chrono::steady_clock;

// Where the first touch is slow it cost 8-40 us a page on the VMs measured;
// where it is not, a kernel read of a page already mapped costs well under
// 1 us, and a first read of a page never mapped (the zero page's fault)
// about 1 us. 2 us a page more than a second read of the same pages tells
// them apart with room on both sides.
constexpr double kSlowFirstTouchUs = 2.0;
// Pages the probe reads: spread over the pool, so that a part some earlier
// kernel access warmed (a read() into the pool's start) does not decide.
constexpr std::size_t kProbePages = 64;

// The kernel reads one byte at each of `local`'s addresses into `scratch`
// (one call); returns how many it read. Through syscall(), not libc's
// wrapper: a sanitizer's interceptor would count the kernel's read as this
// thread reading the pool while peers and the owner write it (TSan reports
// it as a race). No user-space code of ours reads those bytes, and nothing
// is done with them.
std::size_t read_bytes(const iovec* local, std::size_t count, std::uint8_t* scratch) {
  iovec remote{scratch, count};
  const long done = ::syscall(SYS_process_vm_writev, ::getpid(), local, count, &remote, 1, 0);
  return done < 0 ? 0 : static_cast<std::size_t>(done);
}

}  // namespace

std::optional<PretouchMode> pretouch_mode_named(std::string_view text) {
  if (text == "auto") return PretouchMode::kAuto;
  if (text == "on") return PretouchMode::kOn;
  if (text == "off") return PretouchMode::kOff;
  return std::nullopt;
}

std::size_t kernel_read_pages(const std::uint8_t* begin, std::size_t len, std::size_t page) {
  std::array<iovec, kPretouchPagesPerCall> local{};
  std::array<std::uint8_t, kPretouchPagesPerCall> scratch{};
  const auto start = reinterpret_cast<std::uintptr_t>(begin);
  const std::uintptr_t end = start + len;
  std::size_t read = 0;
  std::uintptr_t at = start;
  while (at < end) {
    std::size_t count = 0;
    for (; count < local.size() && at < end; ++count) {
      // The first byte of each page that lies in the range.
      local[count] = iovec{reinterpret_cast<void*>(at), 1};
      at = (at / page + 1) * page;
    }
    const std::size_t done = read_bytes(local.data(), count, scratch.data());
    read += done;
    if (done != count) break;
  }
  return read;
}

Pretouch::Pretouch(const void* base, std::uint64_t len, PretouchMode mode, std::string agent)
    : mode_(mode),
      agent_(std::move(agent)),
      page_(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))),
      verdict_(mode == PretouchMode::kOn ? Verdict::kSlow
               : mode == PretouchMode::kOff ? Verdict::kSkip
                                            : Verdict::kUnknown) {
  add(0, base, len);
}

Pretouch::~Pretouch() { stop(); }

void Pretouch::add(std::uint64_t id, const void* base, std::uint64_t len) {
  if (base == nullptr || len == 0) return;
  MutexLock lock(mu_);
  if (stop_ || verdict_ == Verdict::kSkip) return;
  queue_.push_back(Range{id, static_cast<const std::uint8_t*>(base), len});
  running_.store(true, std::memory_order_release);
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { run(); });
    started_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

void Pretouch::remove(std::uint64_t id) {
  MutexLock lock(mu_);
  std::erase_if(queue_, [id](const Range& r) { return r.id == id; });
  while (current_ == id) {
    cancel_current_ = true;
    lock.wait(cv_);
  }
}

void Pretouch::stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool Pretouch::first_touch_is_slow(const Range& r) {
  const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(r.base);
  const std::uint64_t pages = (start + r.len - 1) / page_ - start / page_ + 1;
  const std::size_t count = static_cast<std::size_t>(std::min<std::uint64_t>(pages, kProbePages));
  std::array<iovec, kProbePages> local{};
  std::array<std::uint8_t, kProbePages> scratch{};
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t p = start / page_ + i * pages / count;
    const std::uintptr_t at = std::max<std::uintptr_t>(start, p * page_);
    local[i] = iovec{reinterpret_cast<void*>(at), 1};
  }
  const auto t0 = Clock::now();
  const std::size_t first = read_bytes(local.data(), count, scratch.data());
  const auto t1 = Clock::now();
  const std::size_t second = read_bytes(local.data(), count, scratch.data());
  const auto t2 = Clock::now();
  pages_.fetch_add(first, std::memory_order_relaxed);
  if (first != count || second != count) {
    log().info("kvxfer {}: no pre-touch: process_vm_writev refused: {}", agent_,
               std::strerror(errno));
    return false;
  }
  const double extra_us = std::chrono::duration<double, std::micro>((t1 - t0) - (t2 - t1)).count() /
                          static_cast<double>(count);
  log().debug("kvxfer {}: a first kernel touch costs {:.2f} us a page more than a second here",
              agent_, extra_us);
  return extra_us > kSlowFirstTouchUs;
}

void Pretouch::run() {
  pthread_setname_np(pthread_self(), "kvxfer-touch");
  MutexLock lock(mu_);
  while (!stop_) {
    if (queue_.empty()) {
      running_.store(false, std::memory_order_release);
      lock.wait(cv_);
      continue;
    }
    const Range r = queue_.front();
    queue_.pop_front();
    current_ = r.id;
    cancel_current_ = false;
    // The probe's verdict is written by this thread only, once.
    const bool probe = verdict_ == Verdict::kUnknown;
    lock.unlock();
    const bool slow = !probe || first_touch_is_slow(r);
    if (slow) touch(r);
    lock.lock();
    if (probe) verdict_ = slow ? Verdict::kSlow : Verdict::kSkip;
    current_.reset();
    cv_.notify_all();
    if (!slow) {
      queue_.clear();  // later ranges are not touched either (add() now ignores them)
      break;
    }
  }
  running_.store(false, std::memory_order_release);
}

void Pretouch::touch(const Range& r) {
  const auto started = Clock::now();
  const std::uint64_t chunk = std::uint64_t{kPretouchPagesPerCall} * page_;
  std::uint64_t off = 0;
  std::uint64_t pages = 0;
  bool ended_early = false;
  while (off < r.len) {
    {
      MutexLock lock(mu_);
      if (stop_ || cancel_current_) {
        ended_early = true;
        break;
      }
    }
    // Chunks end on page boundaries, so each page is read once.
    const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(r.base + off);
    const std::uint64_t n = std::min<std::uint64_t>(r.len - off, chunk - at % page_);
    const std::size_t read = kernel_read_pages(r.base + off, n, page_);
    pages_.fetch_add(read, std::memory_order_relaxed);
    pages += read;
    if (read != (at + n - 1) / page_ - at / page_ + 1) {
      log().info("kvxfer {}: pre-touch of range {} stopped at byte {}: {}", agent_, r.id, off,
                 std::strerror(errno));
      break;
    }
    off += n;
  }
  log().info("kvxfer {}: pre-touched {} pages of {} in {:.3f} s{}", agent_, pages,
             r.id == 0 ? std::string("the pool") : fmt::format("region {:#x}", r.id),
             std::chrono::duration<double>(Clock::now() - started).count(),
             ended_early ? " (stopped)" : "");
}

}  // namespace kvxfer::internal
