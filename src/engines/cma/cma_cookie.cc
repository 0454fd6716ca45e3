// SPDX-License-Identifier: Apache-2.0
#include "engines/cma/cma_cookie.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "common/random.h"
#include "wire/bytes.h"

namespace kvxfer::internal::cma {
namespace {

Status read_words(pid_t pid, std::uint64_t addr, void* out, std::size_t len, int* err) {
  iovec local{out, len};
  iovec remote{reinterpret_cast<void*>(addr), len};
  const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  *err = n < 0 ? errno : 0;
  if (n == static_cast<ssize_t>(len)) return Status::kSuccess;
  if (n < 0 && (errno == ESRCH || errno == EFAULT)) return Status::kRemoteDisconnect;
  if (n < 0 && errno == EPERM) return Status::kNotAllowed;
  return Status::kBackend;
}

// The epoch at `addr` in `pid`, as the first 8 bytes of a declaration.
Status read_epoch(pid_t pid, std::uint64_t addr, std::uint64_t* epoch, int* err) {
  std::uint8_t bytes[wire::kCookieEpochLen];
  const Status st = read_words(pid, addr + wire::kCookieEpochAt, bytes, sizeof(bytes), err);
  if (st == Status::kSuccess) *epoch = wire::load_le<std::uint64_t>(bytes);
  return st;
}

// What /proc/<pid>/maps names a page created by Cookie: a memfd no pool
// can be, since only the target's kvxfer names one so.
constexpr const char* kCookieMapping = "/memfd:kvxfer-cookie (deleted)";

// kSuccess when the mapping of `pid` that starts at `addr` is exactly one
// cookie page (a memfd named as Cookie names it); kMismatch for anything
// else, e.g. a page of the pool whose bytes were written to look like a
// declaration. Reads the maps up to that address only.
Status check_cookie_mapping(pid_t pid, std::uint64_t addr, int* err) {
  const std::string path = "/proc/" + std::to_string(pid) + "/maps";
  std::FILE* maps = std::fopen(path.c_str(), "re");
  if (maps == nullptr) {
    *err = errno;
    if (errno == ENOENT || errno == ESRCH) return Status::kRemoteDisconnect;
    if (errno == EACCES || errno == EPERM) return Status::kNotAllowed;
    return Status::kBackend;
  }
  Status st = Status::kMismatch;
  char line[512];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    char* rest = nullptr;
    const std::uint64_t start = std::strtoull(line, &rest, 16);
    if (rest == nullptr || *rest != '-') break;
    const std::uint64_t end = std::strtoull(rest + 1, &rest, 16);
    if (start > addr) break;
    if (addr >= end) continue;
    // Found: the page must be the whole mapping, and a cookie's.
    std::string text(line);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    const std::string name(kCookieMapping);
    if (start == addr && end - start == 4096 && text.size() >= name.size() &&
        text.compare(text.size() - name.size(), name.size(), name) == 0) {
      st = Status::kSuccess;
    }
    break;
  }
  std::fclose(maps);
  return st;
}

}  // namespace

PidNamespace own_pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return {};
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

Cookie::Cookie(const Region& pool, std::uint32_t pool_fd, std::uint64_t pool_offset,
               std::uint64_t epoch)
    : epoch_(epoch) {
  static_assert(wire::kCookieLen <= kPageLen && kPageLen % kAlign == 0);
  // A memfd of its own name, so that peers can tell the page from any other
  // memory of this process (check_cookie_mapping). Kept open and declared,
  // so that a peer that maps our pool can map this page too (read-only);
  // sealed at one page, so that its mapping can never fault (SIGBUS).
  const int fd = ::memfd_create("kvxfer-cookie", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw std::runtime_error("kvxfer cma: memfd_create of the cookie page failed");
  void* page = MAP_FAILED;
  if (::ftruncate(fd, kPageLen) == 0 &&
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    // Low in the address space when that is free, so that a peer's check
    // (check_cookie_mapping) finds it among the first lines of our maps
    // instead of after every library and pool mapped top-down: 4 GiB plus a
    // random page of the next 1 GiB. Anywhere else when taken.
    const std::uint64_t hint = (std::uint64_t{1} << 32) + (random_u64() % (1u << 18)) * kPageLen;
    page = ::mmap(reinterpret_cast<void*>(hint), kPageLen, PROT_READ | PROT_WRITE,
                  MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
    if (page == MAP_FAILED) {
      page = ::mmap(nullptr, kPageLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
  }
  if (page == MAP_FAILED) {
    ::close(fd);
    throw std::runtime_error("kvxfer cma: mmap of the cookie page failed");
  }
  constexpr std::size_t kTableLen = std::size_t{wire::kCookieMaxSlots} * wire::kRegionEntryLen;
  void* table = ::mmap(nullptr, kTableLen, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (table == MAP_FAILED) {
    ::munmap(page, kPageLen);
    ::close(fd);
    throw std::runtime_error("kvxfer cma: mmap of the region table failed");
  }
  fd_ = fd;
  page_ = static_cast<std::uint8_t*>(page);
  table_ = static_cast<std::uint8_t*>(table);
  while (epoch_ == 0) epoch_ = random_u64();
  // The pool was checked when the transport was built (region_is_valid, or
  // none: all zeros), so what is written here decodes on the peer's side.
  wire::encode_cookie(
      page_,
      Declaration{epoch_, reinterpret_cast<std::uintptr_t>(pool.base), pool.num_blocks,
                  pool.block_len, pool_fd, pool_offset, static_cast<std::uint32_t>(fd_),
                  table_addr(), wire::kCookieMaxSlots, static_cast<std::uint32_t>(fence_.fd())});
}

Cookie::~Cookie() {
  retire();
  if (table_ != nullptr) {
    ::munmap(table_, std::size_t{wire::kCookieMaxSlots} * wire::kRegionEntryLen);
  }
}

namespace {

// An entry's words, written as wire/cookie.h lays them out (little-endian
// hosts only, as the rest of the same-host lane's memory is read as is).
std::uint64_t* entry_words(std::uint8_t* table, std::uint32_t slot) {
  static_assert(std::endian::native == std::endian::little);
  return reinterpret_cast<std::uint64_t*>(table + std::size_t{slot} * wire::kRegionEntryLen);
}

// The seqlock writer's steps: seq odd, the fields, seq even and new. The
// fence table's copy of the seq (`fence_seq`) takes the new value first: a
// peer that reads the settled entry at connect then finds the same seq in
// the fence, and one that marks the slot after a withdrawal began finds the
// withdrawal there (cma_fence.h).
void write_entry(std::uint64_t* words, std::atomic_ref<std::uint64_t> fence_seq, std::uint64_t id,
                 std::uint64_t base, std::uint64_t len) {
  std::atomic_ref<std::uint64_t> seq(words[0]);
  const std::uint64_t next = seq.load(std::memory_order_relaxed) + 1;
  seq.store(next, std::memory_order_seq_cst);
  fence_seq.store(next + 1, std::memory_order_seq_cst);
  std::atomic_ref<std::uint64_t>(words[1]).store(id, std::memory_order_release);
  std::atomic_ref<std::uint64_t>(words[2]).store(base, std::memory_order_release);
  std::atomic_ref<std::uint64_t>(words[3]).store(len, std::memory_order_release);
  seq.store(next + 1, std::memory_order_seq_cst);
}

}  // namespace

void Cookie::declare(const MemRegion& region) {
  const std::uint32_t slot = region_slot(region.id);
  if (table_ == nullptr || slot == 0 || slot >= wire::kCookieMaxSlots) return;
  write_entry(entry_words(table_, slot), fence_.words().seq(slot), region.id, region.base,
              region.len);
}

void Cookie::withdraw(std::uint64_t id) {
  const std::uint32_t slot = region_slot(id);
  if (table_ == nullptr || slot == 0 || slot >= wire::kCookieMaxSlots) return;
  write_entry(entry_words(table_, slot), fence_.words().seq(slot), 0, 0, 0);
}

void Cookie::retire() {
  if (page_ == nullptr) return;
  // The epoch first, then the rest: a peer whose read of the declaration
  // already sees the rest cleared reads the epoch again and finds it 0, so it
  // takes the page for a retired cookie (the target went away), not for a
  // page that was never one (read_declaration).
  // Word stores through atomic_ref: the later ones are release stores, so
  // none of them becomes visible before the epoch's zero (the page is
  // page-aligned and the declaration a whole number of words).
  static_assert(wire::kCookieEpochAt == 0 && wire::kCookieLen % 8 == 0);
  auto* words = reinterpret_cast<std::uint64_t*>(page_);
  std::atomic_ref<std::uint64_t>(words[0]).store(0, std::memory_order_seq_cst);
  for (std::size_t i = 1; i < wire::kCookieLen / 8; ++i) {
    std::atomic_ref<std::uint64_t>(words[i]).store(0, std::memory_order_release);
  }
  ::munmap(page_, kPageLen);
  page_ = nullptr;
  // Peers that mapped the page keep it (reading epoch 0); none can map it
  // anew.
  ::close(fd_);
  fd_ = -1;
}

Status read_cookie(pid_t pid, std::uint64_t addr, std::uint64_t epoch, int* err) {
  std::uint64_t value = 0;
  const Status st = read_epoch(pid, addr, &value, err);
  if (st != Status::kSuccess) return st;
  return value == epoch ? Status::kSuccess : Status::kRemoteDisconnect;
}

Status read_declaration(pid_t pid, std::uint64_t addr, Declaration* out, int* err) {
  *err = 0;
  if (addr % Cookie::kAlign != 0) return Status::kMismatch;
  if (const Status st = check_cookie_mapping(pid, addr, err); st != Status::kSuccess) return st;
  std::uint8_t bytes[wire::kCookieLen];
  if (const Status st = read_words(pid, addr, bytes, sizeof(bytes), err); st != Status::kSuccess) {
    return st;
  }
  const auto epoch = wire::load_le<std::uint64_t>(bytes + wire::kCookieEpochAt);
  // A retired cookie page reads epoch 0: the target's engine shut down.
  if (epoch == 0) return Status::kRemoteDisconnect;
  if (wire::decode_cookie(bytes, out)) return Status::kSuccess;
  // Bytes that do not decode on a page that is a cookie's: either the
  // engine retired it while we read (its epoch changed: gone), or the page
  // declares nothing we can trust (not a cookie page).
  std::uint64_t again = 0;
  if (const Status st = read_epoch(pid, addr, &again, err); st != Status::kSuccess) return st;
  return again == epoch ? Status::kMismatch : Status::kRemoteDisconnect;
}

}  // namespace kvxfer::internal::cma

namespace kvxfer::internal::cma {

namespace {

// process_vm_readv of `n` remote iovecs into `local` (`local_n` of them),
// which must read `want` bytes: kSuccess, or what read_cookie returns for
// a failure. *err: the errno, or 0.
Status read_all(pid_t pid, const iovec* local, std::size_t local_n, const iovec* remote,
                std::size_t n, std::size_t want, int* err) {
  const ssize_t got = ::process_vm_readv(pid, local, local_n, remote, n, 0);
  *err = got < 0 ? errno : 0;
  if (got == static_cast<ssize_t>(want)) return Status::kSuccess;
  if (got < 0 && (*err == ESRCH || *err == EFAULT)) return Status::kRemoteDisconnect;
  if (got < 0 && *err == EPERM) return Status::kNotAllowed;
  return Status::kBackend;
}

}  // namespace

Status read_region_entries(pid_t pid, std::uint64_t table_addr,
                           std::span<const std::uint32_t> slots, std::span<wire::RegionEntry> out,
                           int* err) {
  *err = 0;
  constexpr std::size_t kBatch = 64;
  std::uint8_t bytes[kBatch][wire::kRegionEntryLen];
  std::uint64_t again[kBatch];
  iovec local[kBatch];
  iovec remote[kBatch];
  for (std::size_t i = 0; i < slots.size(); i += kBatch) {
    const std::size_t n = std::min(kBatch, slots.size() - i);
    for (std::size_t k = 0; k < n; ++k) {
      local[k] = {bytes[k], wire::kRegionEntryLen};
      remote[k] = {reinterpret_cast<void*>(entry_addr(table_addr, slots[i + k])),
                   wire::kRegionEntryLen};
    }
    Status st = read_all(pid, local, n, remote, n, n * wire::kRegionEntryLen, err);
    if (st != Status::kSuccess) return st;
    // The seqs again: an entry whose seq moved meanwhile was changing.
    for (std::size_t k = 0; k < n; ++k) {
      local[k] = {&again[k], sizeof(std::uint64_t)};
      remote[k].iov_len = sizeof(std::uint64_t);
    }
    st = read_all(pid, local, n, remote, n, n * sizeof(std::uint64_t), err);
    if (st != Status::kSuccess) return st;
    for (std::size_t k = 0; k < n; ++k) {
      wire::RegionEntry e;
      const bool settled = wire::decode_region_entry(bytes[k], &e) && e.seq == again[k];
      out[i + k] = settled ? e : wire::RegionEntry{};
    }
  }
  return Status::kSuccess;
}

Status read_cookie_and_seqs(pid_t pid, std::uint64_t cookie_addr, std::uint64_t epoch,
                            std::span<const std::uint64_t> seq_addrs,
                            std::span<const std::uint64_t> seqs, int* err) {
  const std::size_t n = std::min(seq_addrs.size(), kMaxSeqReads);
  std::uint64_t words[1 + kMaxSeqReads];
  const iovec local{words, (1 + n) * sizeof(std::uint64_t)};
  iovec remote[1 + kMaxSeqReads];
  remote[0] = {reinterpret_cast<void*>(cookie_addr + wire::kCookieEpochAt), sizeof(std::uint64_t)};
  for (std::size_t k = 0; k < n; ++k) {
    remote[1 + k] = {reinterpret_cast<void*>(seq_addrs[k]), sizeof(std::uint64_t)};
  }
  if (const Status st = read_all(pid, &local, 1, remote, 1 + n, local.iov_len, err);
      st != Status::kSuccess) {
    return st;
  }
  if (wire::load_le<std::uint64_t>(reinterpret_cast<const std::uint8_t*>(&words[0])) != epoch) {
    return Status::kRemoteDisconnect;
  }
  for (std::size_t k = 0; k < n; ++k) {
    if (words[1 + k] != seqs[k]) return Status::kMismatch;
  }
  return Status::kSuccess;
}

}  // namespace kvxfer::internal::cma
