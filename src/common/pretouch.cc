// SPDX-License-Identifier: Apache-2.0
#include "common/pretouch.h"

#include <pthread.h>
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
// (one call); returns how many it read.
std::size_t read_bytes(const iovec* local, std::size_t count, std::uint8_t* scratch) {
  iovec remote{scratch, count};
  const ssize_t done = ::process_vm_writev(::getpid(), local, count, &remote, 1, 0);
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
    : base_(static_cast<const std::uint8_t*>(base)),
      len_(len),
      mode_(mode),
      agent_(std::move(agent)),
      page_(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))) {
  if (mode_ == PretouchMode::kOff || len_ == 0 || base_ == nullptr) return;
  running_.store(true, std::memory_order_release);
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

Pretouch::~Pretouch() { stop(); }

void Pretouch::stop() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

bool Pretouch::first_touch_is_slow() {
  const std::uintptr_t start = reinterpret_cast<std::uintptr_t>(base_);
  const std::uint64_t pages = (start + len_ - 1) / page_ - start / page_ + 1;
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
    log().info("kvxfer {}: no pre-touch of the pool: process_vm_writev refused: {}", agent_,
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
  if (mode_ == PretouchMode::kOn || first_touch_is_slow()) {
    const auto started = Clock::now();
    const std::uint64_t chunk = std::uint64_t{kPretouchPagesPerCall} * page_;
    std::uint64_t off = 0;
    while (off < len_ && !stop_.load(std::memory_order_relaxed)) {
      // Chunks end on page boundaries, so each page is read once.
      const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(base_ + off);
      const std::uint64_t n = std::min<std::uint64_t>(len_ - off, chunk - at % page_);
      const std::size_t read = kernel_read_pages(base_ + off, n, page_);
      pages_.fetch_add(read, std::memory_order_relaxed);
      if (read != (at + n - 1) / page_ - at / page_ + 1) {
        log().info("kvxfer {}: pre-touch of the pool stopped at byte {}: {}", agent_, off,
                   std::strerror(errno));
        break;
      }
      off += n;
    }
    log().info("kvxfer {}: pre-touched {} pages of the pool in {:.3f} s{}", agent_,
               pages_.load(std::memory_order_relaxed),
               std::chrono::duration<double>(Clock::now() - started).count(),
               stop_.load(std::memory_order_relaxed) ? " (stopped)" : "");
  }
  running_.store(false, std::memory_order_release);
}

}  // namespace kvxfer::internal
