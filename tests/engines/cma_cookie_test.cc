// SPDX-License-Identifier: Apache-2.0
// The same-host cookie page (engines/cma/cma_cookie.h) read back from this
// very process: what Cookie writes is the wire format (wire/cookie.h), and
// read_declaration takes a page for a cookie only when its mapping is a
// cookie's and its bytes decode; a retired page means the target went away.
#include "engines/cma/cma_cookie.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <ostream>
#include <utility>
#include <vector>

#include "engines/cma/cma_fence.h"
#include "wire/bytes.h"
#include "wire/cookie.h"

namespace kvxfer {
// Statuses by name in failure messages.
void PrintTo(Status status, std::ostream* os) { *os << status_name(status); }
}  // namespace kvxfer

namespace kvxfer::internal::cma {
namespace {

constexpr std::uint64_t kBlocks = 16;
constexpr std::uint64_t kBlockLen = 4096;
constexpr std::uint64_t kEpoch = 0x6b7678636f6f6b69;

// A page mapped as Cookie maps its own (a one-page memfd of the same name),
// whose bytes the test writes: what a target with other bytes on its cookie
// page would show a peer.
class CookieLikePage {
 public:
  CookieLikePage() {
    const int fd = ::memfd_create("kvxfer-cookie", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) return;
    void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (page != MAP_FAILED) page_ = static_cast<std::uint8_t*>(page);
  }
  ~CookieLikePage() {
    if (page_ != nullptr) ::munmap(page_, 4096);
  }
  CookieLikePage(const CookieLikePage&) = delete;
  CookieLikePage& operator=(const CookieLikePage&) = delete;

  [[nodiscard]] bool ok() const { return page_ != nullptr; }
  [[nodiscard]] std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(page_); }
  void write(const std::vector<std::uint8_t>& bytes) {
    std::memset(page_, 0, 4096);
    std::memcpy(page_, bytes.data(), bytes.size());
  }

 private:
  std::uint8_t* page_ = nullptr;
};

std::vector<std::uint8_t> encoded(const wire::CookieDeclaration& d) {
  std::vector<std::uint8_t> out(wire::kCookieLen);
  wire::encode_cookie(out.data(), d);
  return out;
}

Status read_own(std::uint64_t addr, Declaration* out) {
  int err = 0;
  return read_declaration(::getpid(), addr, out, &err);
}

class CookieTest : public ::testing::Test {
 protected:
  std::vector<std::uint8_t> pool_ = std::vector<std::uint8_t>(kBlocks * kBlockLen);
  Region region_{pool_.data(), kBlocks, kBlockLen};
  const std::uint64_t base_ = reinterpret_cast<std::uintptr_t>(pool_.data());
};

TEST_F(CookieTest, ThePageHoldsTheDeclarationInTheWireFormat) {
  Cookie cookie(region_);
  const auto* page = reinterpret_cast<const std::uint8_t*>(cookie.addr());
  ASSERT_GE(cookie.fd(), 0);
  EXPECT_EQ(std::vector<std::uint8_t>(page, page + wire::kCookieLen),
            encoded(wire::CookieDeclaration{cookie.epoch(), base_, kBlocks, kBlockLen, wire::kNoFd,
                                            0, static_cast<std::uint32_t>(cookie.fd()),
                                            cookie.table_addr(), wire::kCookieMaxSlots,
                                            static_cast<std::uint32_t>(cookie.fence().fd())}));
  EXPECT_GE(cookie.fence().fd(), 0);
  EXPECT_NE(cookie.epoch(), 0u);
}

TEST(CookieNoPool, ACookieWithNoPoolDeclaresZerosAndATable) {
  Cookie cookie(Region{});
  Declaration d;
  ASSERT_EQ(read_own(cookie.addr(), &d), Status::kSuccess);
  EXPECT_EQ(d.base_addr, 0u);
  EXPECT_EQ(d.num_blocks, 0u);
  EXPECT_EQ(d.block_len, 0u);
  EXPECT_EQ(d.pool_fd, wire::kNoFd);
  EXPECT_EQ(d.table_addr, cookie.table_addr());
  EXPECT_EQ(d.table_slots, wire::kCookieMaxSlots);
}

// What a peer reads of the table: a declared region as declared, with an
// even seq; withdrawn, empty with a newer seq, so a check against the seq
// read while it was declared fails while the epoch still matches.
TEST(CookieNoPool, DeclaredRegionsReadBackAndAWithdrawalChangesTheirSeq) {
  Cookie cookie(Region{});
  std::vector<std::uint8_t> buffer(8192);
  const MemRegion r{(std::uint64_t{3} << 32) | 7, reinterpret_cast<std::uintptr_t>(buffer.data()),
                    buffer.size()};
  cookie.declare(r);
  const std::uint32_t slots[] = {7, 8};
  wire::RegionEntry entries[2];
  int err = 0;
  ASSERT_EQ(read_region_entries(::getpid(), cookie.table_addr(), slots, entries, &err),
            Status::kSuccess);
  EXPECT_EQ(entries[0].id, r.id);
  EXPECT_EQ(entries[0].base, r.base);
  EXPECT_EQ(entries[0].len, r.len);
  EXPECT_EQ(entries[0].seq % 2, 0u);
  EXPECT_NE(entries[0].seq, 0u);
  EXPECT_EQ(entries[1].len, 0u);  // never declared
  const std::uint64_t seq_addr = entry_addr(cookie.table_addr(), 7);
  const std::uint64_t seq = entries[0].seq;
  EXPECT_EQ(read_cookie_and_seqs(::getpid(), cookie.addr(), cookie.epoch(), std::span(&seq_addr, 1),
                                 std::span(&seq, 1), &err),
            Status::kSuccess);
  cookie.withdraw(r.id);
  EXPECT_EQ(read_cookie_and_seqs(::getpid(), cookie.addr(), cookie.epoch(), std::span(&seq_addr, 1),
                                 std::span(&seq, 1), &err),
            Status::kMismatch);
  ASSERT_EQ(read_region_entries(::getpid(), cookie.table_addr(), slots, entries, &err),
            Status::kSuccess);
  EXPECT_EQ(entries[0].len, 0u);
  cookie.retire();
  EXPECT_EQ(read_cookie_and_seqs(::getpid(), cookie.addr(), cookie.epoch(), std::span(&seq_addr, 1),
                                 std::span(&seq, 1), &err),
            Status::kRemoteDisconnect);
}

// The descriptor the page declares is its own memfd, sealed at one page, so
// that a peer's mapping of it can never fault; retiring closes it.
TEST_F(CookieTest, TheDeclaredDescriptorIsThePagesSealedMemfd) {
  Cookie cookie(region_);
  const int fd = cookie.fd();
  ASSERT_GE(fd, 0);
  EXPECT_NE(::fcntl(fd, F_GET_SEALS) & F_SEAL_SHRINK, 0);
  EXPECT_NE(::ftruncate(fd, 0), 0);
  void* view = ::mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(view, MAP_FAILED);
  EXPECT_EQ(std::memcmp(view, reinterpret_cast<const void*>(cookie.addr()), wire::kCookieLen), 0);
  ::munmap(view, 4096);
  cookie.retire();
  EXPECT_EQ(cookie.fd(), -1);
}

TEST_F(CookieTest, APeerReadsBackTheEpochAndThePool) {
  Cookie cookie(region_);
  Declaration d;
  ASSERT_EQ(read_own(cookie.addr(), &d), Status::kSuccess);
  EXPECT_EQ(d.epoch, cookie.epoch());
  EXPECT_EQ(d.base_addr, base_);
  EXPECT_EQ(d.num_blocks, kBlocks);
  EXPECT_EQ(d.block_len, kBlockLen);
  int err = 0;
  EXPECT_EQ(read_cookie(::getpid(), cookie.addr(), cookie.epoch(), &err), Status::kSuccess);
  EXPECT_EQ(read_cookie(::getpid(), cookie.addr(), cookie.epoch() ^ 1, &err),
            Status::kRemoteDisconnect);
}

TEST_F(CookieTest, ARetiredCookieNoLongerReadsBack) {
  Cookie cookie(region_);
  const std::uint64_t addr = cookie.addr();
  const std::uint64_t epoch = cookie.epoch();
  cookie.retire();
  int err = 0;
  EXPECT_EQ(read_cookie(::getpid(), addr, epoch, &err), Status::kRemoteDisconnect);
  Declaration d;
  EXPECT_NE(read_own(addr, &d), Status::kSuccess);
}

// Sanity of the helper: the page passes the mapping check, so the verdicts
// below are about its bytes.
TEST_F(CookieTest, AWellFormedDeclarationOnACookieLikePageIsRead) {
  CookieLikePage page;
  ASSERT_TRUE(page.ok());
  page.write(encoded(wire::CookieDeclaration{kEpoch, base_, kBlocks, kBlockLen}));
  Declaration d;
  ASSERT_EQ(read_own(page.addr(), &d), Status::kSuccess);
  EXPECT_EQ(d.epoch, kEpoch);
  EXPECT_EQ(d.base_addr, base_);
}

// The page's bytes before the declaration was a wire format (four native
// words) are not a declaration: not a cookie page.
TEST_F(CookieTest, TheOldNativeLayoutIsNotACookie) {
  CookieLikePage page;
  ASSERT_TRUE(page.ok());
  std::vector<std::uint8_t> native(32);
  const std::uint64_t words[4] = {kEpoch, base_, kBlocks, kBlockLen};
  std::memcpy(native.data(), words, sizeof(words));
  page.write(native);
  Declaration d{9, 9, 9, 9};
  EXPECT_EQ(read_own(page.addr(), &d), Status::kMismatch);
  EXPECT_EQ(d.base_addr, 9u);
}

TEST_F(CookieTest, BytesThatDoNotDecodeAreNotACookie) {
  const auto good = encoded(wire::CookieDeclaration{kEpoch, base_, kBlocks, kBlockLen});
  auto patched = [&](std::size_t at, std::uint8_t value) {
    auto bytes = good;
    bytes[at] = value;
    return bytes;
  };
  const std::vector<std::pair<const char*, std::vector<std::uint8_t>>> cases = {
      {"magic", patched(8, 'X')},
      {"version", patched(12, 2)},
      {"a table without slots", patched(56, 8)},
      {"an offset without a pool fd", patched(48, 1)},
      {"reserved", patched(14, 1)},
      {"no blocks", encoded(wire::CookieDeclaration{kEpoch, base_, 0, kBlockLen})},
      {"pool past the top",
       encoded(wire::CookieDeclaration{kEpoch, ~0ull - kBlockLen, kBlocks, kBlockLen})},
  };
  for (const auto& [what, bytes] : cases) {
    CookieLikePage page;
    ASSERT_TRUE(page.ok());
    page.write(bytes);
    Declaration d;
    EXPECT_EQ(read_own(page.addr(), &d), Status::kMismatch) << what;
  }
}

// A cleared page (epoch 0) is a cookie its engine retired: the target went
// away, as when the epoch no longer matches.
TEST_F(CookieTest, AClearedCookiePageMeansTheTargetWentAway) {
  CookieLikePage page;
  ASSERT_TRUE(page.ok());
  page.write(std::vector<std::uint8_t>(wire::kCookieLen, 0));
  Declaration d;
  EXPECT_EQ(read_own(page.addr(), &d), Status::kRemoteDisconnect);
}

// The fence table (cma_fence.h) as a peer of this process uses it: a mark
// taken while the region is declared holds a removal's wait until it is
// taken back; a mark after the withdrawal fails at once and holds nothing.
TEST(CookieNoPool, AMarkTakenBeforeAWithdrawalHoldsTheRemovalUntilItIsTakenBack) {
  Cookie cookie(Region{});
  std::vector<std::uint8_t> buffer(8192);
  const MemRegion r{(std::uint64_t{3} << 32) | 7, reinterpret_cast<std::uintptr_t>(buffer.data()),
                    buffer.size()};
  cookie.declare(r);
  const std::uint32_t slot = 7;
  wire::RegionEntry entry;
  int err = 0;
  ASSERT_EQ(read_region_entries(::getpid(), cookie.table_addr(), std::span(&slot, 1),
                                std::span(&entry, 1), &err),
            Status::kSuccess);
  PeerFence fence;
  std::string why;
  ASSERT_EQ(map_peer_fence(::getpid(), static_cast<std::uint32_t>(cookie.fence().fd()), &fence,
                           &why),
            Status::kSuccess)
      << why;
  ASSERT_TRUE(fence.mark(std::span(&slot, 1), std::span(&entry.seq, 1)));
  cookie.withdraw(r.id);
  pid_t holder = 0;
  EXPECT_FALSE(cookie.fence().await_unmarked(slot, std::chrono::milliseconds(20), &holder));
  EXPECT_EQ(holder, ::getpid());
  fence.unmark(std::span(&slot, 1));
  EXPECT_TRUE(cookie.fence().await_unmarked(slot, std::chrono::milliseconds(20), &holder));
  EXPECT_FALSE(fence.mark(std::span(&slot, 1), std::span(&entry.seq, 1)));
  EXPECT_TRUE(cookie.fence().await_unmarked(slot, std::chrono::milliseconds(0), &holder));
}

TEST(CookieNoPool, OnlyAFenceTableIsMappedAsOne) {
  Cookie cookie(Region{});
  PeerFence fence;
  std::string why;
  EXPECT_EQ(map_peer_fence(::getpid(), static_cast<std::uint32_t>(cookie.fd()), &fence, &why),
            Status::kMismatch);
  EXPECT_FALSE(fence.ready());
  EXPECT_NE(why.find("not a sealed fence table"), std::string::npos) << why;
}

}  // namespace
}  // namespace kvxfer::internal::cma
