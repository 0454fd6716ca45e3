// SPDX-License-Identifier: Apache-2.0
// The kernel's first touch of a registered pool, paid once at registration
// on a thread of its own instead of by the first transfers. Used by the
// core for the transport's pool and regions; knows nothing of lanes or peers.
//
// Why: on some paravirtualized guests (PVM: `pvm_irq_enable` under every
// fault) the first time the kernel copies from or into a user page through
// its user address (process_vm_writev's local side, a socket's send and
// receive) costs 8-40 us per 4 KiB page, even for pages the process wrote
// just before; user-space copies pay nothing, and the cost does not come
// back once paid (later user writes to the page included). A kernel read
// of one byte of each page pays it for reads and writes alike; populating
// the pages (MADV_POPULATE_READ/WRITE, mlock) does not, since it walks the
// page tables without a user-address access. docs/performance.md has the
// figures.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvxfer::internal {

enum class PretouchMode {
  kAuto,  // touch every page where a probe finds the first touch slow
  kOn,    // touch every page, no probe
  kOff,   // no thread, nothing touched
};

// "auto", "on", "off"; nothing for any other text.
[[nodiscard]] std::optional<PretouchMode> pretouch_mode_named(std::string_view text);

// Has the kernel read one byte of each page of [begin, begin + len), through
// the page's user address: process_vm_writev from this process into a
// scratch buffer of its own, up to kPretouchPagesPerCall pages a call. It
// only reads: no byte of the range changes, whatever other threads write
// there meanwhile. `page` is the page size. Returns the pages read, fewer
// than the range holds when the kernel refuses (errno says why).
[[nodiscard]] std::size_t kernel_read_pages(const std::uint8_t* begin, std::size_t len,
                                            std::size_t page);

inline constexpr std::size_t kPretouchPagesPerCall = 256;

// The thread that touches a transport's memory once: the pool, and each
// region registered besides it (add/remove), in the order they came. One
// thread per transport, started with the first range (unless kOff); in
// kAuto a probe of that range decides for every later one, and where the
// first touch is not slow the thread ends and later ranges are ignored.
// stop() or the destructor ends it within one call of kernel_read_pages
// (256 pages: ~10 ms where the first touch is slow, microseconds
// elsewhere). Never takes a lock of its caller's.
class Pretouch {
 public:
  // `base`/`len`: the pool, range 0 (none when empty). `agent` names the
  // transport in its log records.
  Pretouch(const void* base, std::uint64_t len, PretouchMode mode, std::string agent);
  ~Pretouch();
  Pretouch(const Pretouch&) = delete;
  Pretouch& operator=(const Pretouch&) = delete;

  // Queues [base, base + len) as range `id` (a region's id; 0 is the
  // pool's), unless the mode is kOff, the probe found the first touch
  // fast, or stop() was called.
  void add(std::uint64_t id, const void* base, std::uint64_t len) EXCLUDES(mu_);
  // Forgets range `id`: returns once the thread reads none of its pages any
  // more (at most one kernel_read_pages call later). Unknown ids are fine.
  void remove(std::uint64_t id) EXCLUDES(mu_);

  // Stops touching and joins the thread. Idempotent; any thread but its own.
  void stop() EXCLUDES(mu_);

  // Whether a thread was started (false for kOff or nothing added yet).
  [[nodiscard]] bool started() const noexcept { return started_.load(std::memory_order_acquire); }
  // Whether the thread is probing or touching, or has ranges queued.
  [[nodiscard]] bool running() const noexcept { return running_.load(std::memory_order_acquire); }
  // Pages touched so far (probe pages included).
  [[nodiscard]] std::uint64_t pages_touched() const noexcept {
    return pages_.load(std::memory_order_relaxed);
  }

 private:
  struct Range {
    std::uint64_t id = 0;
    const std::uint8_t* base = nullptr;
    std::uint64_t len = 0;
  };
  enum class Verdict { kUnknown, kSlow, kSkip };

  void run() EXCLUDES(mu_);
  // Touches `r` chunk by chunk until it ends, stop() or remove(r.id).
  void touch(const Range& r) EXCLUDES(mu_);
  // Whether a first kernel touch costs more than kSlowFirstTouch a page
  // here, judged on up to kProbePages pages spread over `r`.
  bool first_touch_is_slow(const Range& r);

  const PretouchMode mode_;
  const std::string agent_;
  const std::size_t page_;
  Mutex mu_;
  std::condition_variable cv_;  // with mu_: a range queued, stop, a chunk ended
  std::deque<Range> queue_ GUARDED_BY(mu_);
  std::optional<std::uint64_t> current_ GUARDED_BY(mu_);  // the range being touched
  bool cancel_current_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  Verdict verdict_ GUARDED_BY(mu_);
  std::atomic<bool> started_{false};
  std::atomic<bool> running_{false};
  std::atomic<std::uint64_t> pages_{0};
  std::thread thread_;  // started by the first add(), under mu_
};

}  // namespace kvxfer::internal
