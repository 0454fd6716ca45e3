// SPDX-License-Identifier: Apache-2.0
// The pool's pre-touch (common/pretouch.h): the kernel reads one byte of
// every page and changes none, even while another thread writes the pool;
// the thread stops at once when asked; off, there is no thread. No verdict
// here rests on a clock: whether a host pays for a first touch is the
// bench's to measure.
#include "common/pretouch.h"
#include "support/proc_threads.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace kvxfer::internal {
namespace {

using kvxfer::test::threads_named;

std::size_t page_size() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// Anonymous memory of `bytes`, unmapped at the end of the test.
class Mapping {
 public:
  explicit Mapping(std::size_t bytes, int prot = PROT_READ | PROT_WRITE, int flags = 0)
      : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    data_ = static_cast<std::uint8_t*>(p);
  }
  ~Mapping() { ::munmap(data_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  [[nodiscard]] std::uint8_t* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::uint8_t* data_;
};

// Threads of this process named `name` (the pre-touch names its thread).
// Waits for the thread to finish; ctest's timeout bounds it.
void wait_done(const Pretouch& t) {
  while (t.running()) std::this_thread::yield();
}

TEST(PretouchTest, ModesAreNamedAutoOnOff) {
  EXPECT_EQ(pretouch_mode_named("auto"), PretouchMode::kAuto);
  EXPECT_EQ(pretouch_mode_named("on"), PretouchMode::kOn);
  EXPECT_EQ(pretouch_mode_named("off"), PretouchMode::kOff);
  for (const char* bad : {"", "yes", "ON", "1", "auto "}) {
    EXPECT_FALSE(pretouch_mode_named(bad).has_value()) << "'" << bad << "'";
  }
}

TEST(PretouchTest, KernelReadPagesCountsEveryPageTheRangeTouches) {
  const std::size_t page = page_size();
  Mapping m(8 * page);
  std::memset(m.data(), 7, m.size());
  EXPECT_EQ(kernel_read_pages(m.data(), m.size(), page), 8u);
  // A range that starts and ends inside pages: 3 bytes of page 0, pages 1-5
  // whole, one byte of page 6.
  EXPECT_EQ(kernel_read_pages(m.data() + page - 3, 5 * page + 4, page), 7u);
  EXPECT_EQ(kernel_read_pages(m.data() + 5, 1, page), 1u);
  // More pages than one call takes.
  Mapping big((kPretouchPagesPerCall * 2 + 3) * page);
  EXPECT_EQ(kernel_read_pages(big.data(), big.size(), page), kPretouchPagesPerCall * 2 + 3);
}

TEST(PretouchTest, KernelReadPagesStopsAtAPageItCannotRead) {
  const std::size_t page = page_size();
  Mapping m(4 * page);
  ASSERT_EQ(::mprotect(m.data() + 2 * page, page, PROT_NONE), 0);
  EXPECT_EQ(kernel_read_pages(m.data(), m.size(), page), 2u);
}

// The pre-touch only reads: a writer's last byte in each page is what the
// page holds after it, however the two interleave. A pre-touch that copied
// a page's bytes back (to fault it in for writing) would put stale bytes
// over the writer's.
TEST(PretouchTest, ThePoolsBytesAreUnchangedWhileAnotherThreadWritesThem) {
  const std::size_t page = page_size();
  constexpr std::size_t kPages = 512;
  Mapping m(kPages * page);
  std::atomic<bool> stop{false};
  std::atomic<std::uint32_t> rounds{0};
  std::thread writer([&] {
    for (std::uint8_t round = 1; !stop.load(); ++round) {
      // Every byte a pre-touch reads (each page's first) and its neighbours.
      for (std::size_t p = 0; p < kPages; ++p) {
        std::atomic_ref<std::uint8_t>(m.data()[p * page]).store(round, std::memory_order_relaxed);
        std::atomic_ref<std::uint8_t>(m.data()[p * page + 1])
            .store(round, std::memory_order_relaxed);
      }
      rounds.fetch_add(1);
    }
  });
  while (rounds.load() < 2) std::this_thread::yield();
  for (int pass = 0; pass < 20; ++pass) {
    EXPECT_EQ(kernel_read_pages(m.data(), m.size(), page), kPages);
  }
  Pretouch touch(m.data(), m.size(), PretouchMode::kOn, "test");
  wait_done(touch);
  stop.store(true);
  writer.join();
  // The writer's last round is in every page, whole.
  const std::uint8_t last = m.data()[(kPages - 1) * page];
  for (std::size_t p = 0; p < kPages; ++p) {
    ASSERT_EQ(m.data()[p * page], last) << "page " << p;
    ASSERT_EQ(m.data()[p * page + 1], last) << "page " << p;
    ASSERT_EQ(m.data()[p * page + 2], 0) << "page " << p;
  }
}

TEST(PretouchTest, OnTouchesEveryPageOfThePoolOnce) {
  const std::size_t page = page_size();
  Mapping m(300 * page);
  // A pool that starts and ends inside pages: 300 pages hold it.
  Pretouch touch(m.data() + 10, 299 * page, PretouchMode::kOn, "test");
  EXPECT_TRUE(touch.started());
  wait_done(touch);
  EXPECT_EQ(touch.pages_touched(), 300u);
}

TEST(PretouchTest, AutoEndsWithTheProbeOrHavingTouchedEveryPage) {
  const std::size_t page = page_size();
  Mapping m(1000 * page);
  std::memset(m.data(), 1, m.size());
  Pretouch touch(m.data(), m.size(), PretouchMode::kAuto, "test");
  EXPECT_TRUE(touch.started());
  wait_done(touch);
  // The probe reads 64 pages; where it found the first touch slow, every
  // page after it (64 + 1000).
  EXPECT_TRUE(touch.pages_touched() == 64 || touch.pages_touched() == 1064)
      << touch.pages_touched();
}

TEST(PretouchTest, OffStartsNoThreadAndTouchesNothing) {
  const std::size_t page = page_size();
  Mapping m(64 * page);
  const int before = threads_named("kvxfer-touch");
  Pretouch touch(m.data(), m.size(), PretouchMode::kOff, "test");
  EXPECT_FALSE(touch.started());
  EXPECT_FALSE(touch.running());
  EXPECT_EQ(threads_named("kvxfer-touch"), before);
  EXPECT_EQ(touch.pages_touched(), 0u);
}

// 16 GiB reserved, never written: each page read maps the zero page, which
// takes seconds for all four million; stop() comes at once and must end
// the thread long before.
TEST(PretouchTest, StopDuringTheTouchEndsItBeforeTheLastPage) {
  const std::size_t bytes = std::size_t{16} << 30;
  Mapping m(bytes, PROT_READ, MAP_NORESERVE);
  Pretouch touch(m.data(), m.size(), PretouchMode::kOn, "test");
  while (touch.pages_touched() == 0) std::this_thread::yield();
  touch.stop();
  EXPECT_FALSE(touch.running());
  EXPECT_GT(touch.pages_touched(), 0u);
  EXPECT_LT(touch.pages_touched(), bytes / page_size());
  touch.stop();  // idempotent
}

TEST(PretouchTest, RangesAddedLaterAreTouchedInTurnByOneThread) {
  const std::size_t page = page_size();
  Mapping a(100 * page);
  Mapping b(50 * page);
  const int before = threads_named("kvxfer-touch");
  Pretouch touch(nullptr, 0, PretouchMode::kOn, "test");
  EXPECT_FALSE(touch.started());  // no pool: no thread until a range comes
  touch.add(1, a.data(), a.size());
  touch.add(2, b.data(), b.size());
  EXPECT_TRUE(touch.started());
  EXPECT_TRUE(touch.running());
  wait_done(touch);
  EXPECT_EQ(touch.pages_touched(), 150u);
  EXPECT_EQ(threads_named("kvxfer-touch"), before + 1);
  touch.stop();
  EXPECT_EQ(threads_named("kvxfer-touch"), before);
}

// Pages of `m` the kernel has mapped (mincore): a kernel read of a page
// never written maps the zero page there, so this counts the pages read.
std::size_t pages_mapped(const Mapping& m) {
  std::vector<unsigned char> in(m.size() / page_size());
  if (::mincore(m.data(), m.size(), in.data()) != 0) throw std::runtime_error("mincore failed");
  return static_cast<std::size_t>(std::count_if(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; }));
}

// A region deregistered while its pages are being read: remove() returns
// within a call and no page of it is read after; the range queued behind it
// is still read.
TEST(PretouchTest, RemoveDuringARangesTouchEndsItAndTheNextIsTouched) {
  const std::size_t bytes = std::size_t{16} << 30;
  Mapping huge(bytes, PROT_READ, MAP_NORESERVE);
  Mapping next(64 * page_size(), PROT_READ);
  Pretouch touch(nullptr, 0, PretouchMode::kOn, "test");
  touch.add(7, huge.data(), huge.size());
  touch.add(8, next.data(), next.size());
  while (touch.pages_touched() == 0) std::this_thread::yield();
  touch.remove(7);
  const std::size_t read = pages_mapped(huge);
  EXPECT_GT(read, 0u);
  EXPECT_LT(read, bytes / page_size());
  wait_done(touch);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(pages_mapped(huge), read);
  EXPECT_EQ(pages_mapped(next), 64u);
  touch.remove(7);   // gone already: returns at once
  touch.remove(99);  // never added
}

TEST(PretouchTest, RemoveOfAQueuedRangeSkipsIt) {
  const std::size_t bytes = std::size_t{16} << 30;
  Mapping huge(bytes, PROT_READ, MAP_NORESERVE);
  Mapping queued(64 * page_size(), PROT_READ);
  Mapping last(32 * page_size(), PROT_READ);
  Pretouch touch(nullptr, 0, PretouchMode::kOn, "test");
  touch.add(1, huge.data(), huge.size());
  touch.add(2, queued.data(), queued.size());
  touch.add(3, last.data(), last.size());
  touch.remove(2);
  touch.remove(1);
  wait_done(touch);
  EXPECT_EQ(pages_mapped(queued), 0u);
  EXPECT_EQ(pages_mapped(last), 32u);
}

TEST(PretouchTest, OffIgnoresRangesAddedLater) {
  Mapping m(16 * page_size());
  Pretouch touch(nullptr, 0, PretouchMode::kOff, "test");
  touch.add(1, m.data(), m.size());
  EXPECT_FALSE(touch.started());
  EXPECT_EQ(touch.pages_touched(), 0u);
}

}  // namespace
}  // namespace kvxfer::internal
