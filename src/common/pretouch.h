// SPDX-License-Identifier: Apache-2.0
// The kernel's first touch of a registered pool, paid once at registration
// on a thread of its own instead of by the first transfers. Used by the
// core for the transport's own pool; knows nothing of lanes or peers.
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
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

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

// The thread that touches a pool once. Starts at construction (unless
// kOff or the pool is empty); stop() or the destructor ends it within one
// call of kernel_read_pages (256 pages: ~10 ms where the first touch is
// slow, microseconds elsewhere). Never takes a lock of its caller's.
class Pretouch {
 public:
  // `agent` names the transport in its log records.
  Pretouch(const void* base, std::uint64_t len, PretouchMode mode, std::string agent);
  ~Pretouch();
  Pretouch(const Pretouch&) = delete;
  Pretouch& operator=(const Pretouch&) = delete;

  // Stops touching and joins the thread. Idempotent; any thread but its own.
  void stop();

  // Whether a thread was started (false for kOff or an empty pool).
  [[nodiscard]] bool started() const noexcept { return started_; }
  // Whether the thread is still probing or touching.
  [[nodiscard]] bool running() const noexcept { return running_.load(std::memory_order_acquire); }
  // Pages touched so far (probe pages included).
  [[nodiscard]] std::uint64_t pages_touched() const noexcept {
    return pages_.load(std::memory_order_relaxed);
  }

 private:
  void run();
  // Whether a first kernel touch costs more than kSlowFirstTouch a page
  // here, judged on up to kProbePages pages spread over the pool.
  bool first_touch_is_slow();

  const std::uint8_t* base_;
  std::uint64_t len_;
  PretouchMode mode_;
  std::string agent_;
  std::size_t page_;
  bool started_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};
  std::atomic<std::uint64_t> pages_{0};
  std::thread thread_;
};

}  // namespace kvxfer::internal
