// SPDX-License-Identifier: Apache-2.0
#include "engines/cma/cma_fence.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

#include "engines/cma/cma_mapping.h"

namespace kvxfer::internal::cma {
namespace {

// What FenceTable names its memfd, and how /proc shows our duplicate of it.
constexpr const char* kFenceName = "kvxfer-fence";
constexpr const char* kFenceLink = "/memfd:kvxfer-fence (deleted)";

}  // namespace

bool process_runs(pid_t pid) {
  if (pid <= 0) return false;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno != ESRCH;  // no such pid: gone; anything else: assume it runs
  // A pidfd polls readable once its process exited, reaped or not.
  pollfd p{pidfd, POLLIN, 0};
  const int ready = ::poll(&p, 1, 0);
  ::close(pidfd);
  return ready == 0;
}

FenceTable::FenceTable() {
  const int fd = ::memfd_create(kFenceName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw std::runtime_error("kvxfer cma: memfd_create of the fence table failed");
  void* map = MAP_FAILED;
  // Sealed at its size, so a peer's mapping of it can never fault (SIGBUS);
  // its pages are backed only where a row or a slot's record is written.
  if (::ftruncate(fd, static_cast<off_t>(wire::kFenceLen)) == 0 &&
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    map = ::mmap(nullptr, wire::kFenceLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (map == MAP_FAILED) {
    ::close(fd);
    throw std::runtime_error("kvxfer cma: mmap of the fence table failed");
  }
  fd_ = fd;
  base_ = static_cast<std::uint8_t*>(map);
}

FenceTable::~FenceTable() {
  if (base_ != nullptr) ::munmap(base_, wire::kFenceLen);
  if (fd_ >= 0) ::close(fd_);
}

bool FenceTable::await_unmarked(std::uint32_t slot, std::chrono::milliseconds limit,
                                pid_t* holder) const {
  const FenceWords words(base_);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (int round = 0;; ++round) {
    bool marked = false;
    for (std::uint32_t row = 0; row < wire::kFenceRows; ++row) {
      std::uint32_t n = words.marks(slot, row).load(std::memory_order_seq_cst);
      if (n == 0) continue;
      const auto pid = static_cast<pid_t>(words.pid(row).load(std::memory_order_seq_cst));
      // Marks of a process that is gone are never taken back: drop them
      // (it copies nothing more), and the row's count of them with them.
      if (round > 0 && !process_runs(pid)) {
        if (words.marks(slot, row).compare_exchange_strong(n, 0, std::memory_order_seq_cst)) {
          words.held(row).fetch_sub(n, std::memory_order_seq_cst);
        }
        continue;
      }
      marked = true;
      *holder = pid;
    }
    if (!marked) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    // A chunk is at most CopyPolicy::kChunkBytes: it ends within a
    // millisecond unless its copier waits for a core.
    if (round < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

PeerFence::PeerFence(PeerFence&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), row_(std::exchange(other.row_, -1)) {}

PeerFence& PeerFence::operator=(PeerFence&& other) noexcept {
  if (this != &other) {
    reset();
    map_ = std::exchange(other.map_, nullptr);
    row_ = std::exchange(other.row_, -1);
  }
  return *this;
}

void PeerFence::reset() noexcept {
  if (row_ >= 0) {
    FenceWords(map_).pid(static_cast<std::uint32_t>(row_)).store(0, std::memory_order_seq_cst);
  }
  if (map_ != nullptr) ::munmap(map_, wire::kFenceLen);
  map_ = nullptr;
  row_ = -1;
}

bool PeerFence::adopt(std::uint8_t* map, pid_t self) {
  reset();
  map_ = map;
  const FenceWords words(map_);
  const auto me = static_cast<std::uint32_t>(self);
  for (std::uint32_t row = 0; row < wire::kFenceRows && row_ < 0; ++row) {
    std::uint32_t free = 0;
    if (words.pid(row).compare_exchange_strong(free, me, std::memory_order_seq_cst)) {
      row_ = static_cast<int>(row);
    }
  }
  // Every row taken: one whose process is gone and that holds no marks
  // (the target dropped any it left) is free again.
  for (std::uint32_t row = 0; row < wire::kFenceRows && row_ < 0; ++row) {
    std::uint32_t pid = words.pid(row).load(std::memory_order_seq_cst);
    if (pid != me && words.held(row).load(std::memory_order_seq_cst) == 0 &&
        !process_runs(static_cast<pid_t>(pid)) &&
        words.pid(row).compare_exchange_strong(pid, me, std::memory_order_seq_cst)) {
      row_ = static_cast<int>(row);
    }
  }
  if (row_ >= 0) return true;
  reset();
  return false;
}

bool PeerFence::mark(std::span<const std::uint32_t> slots,
                     std::span<const std::uint64_t> seqs) const {
  const FenceWords words(map_);
  const auto row = static_cast<std::uint32_t>(row_);
  // The row's count first: a process that dies between the two leaves a
  // count without marks (its row is lost), never marks the count misses.
  words.held(row).fetch_add(static_cast<std::uint32_t>(slots.size()), std::memory_order_seq_cst);
  for (const std::uint32_t slot : slots) {
    words.marks(slot, row).fetch_add(1, std::memory_order_seq_cst);
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (words.seq(slots[i]).load(std::memory_order_seq_cst) != seqs[i]) {
      unmark(slots);
      return false;
    }
  }
  return true;
}

void PeerFence::unmark(std::span<const std::uint32_t> slots) const {
  const FenceWords words(map_);
  const auto row = static_cast<std::uint32_t>(row_);
  for (const std::uint32_t slot : slots) {
    words.marks(slot, row).fetch_sub(1, std::memory_order_seq_cst);
  }
  words.held(row).fetch_sub(static_cast<std::uint32_t>(slots.size()), std::memory_order_seq_cst);
}

Status map_peer_fence(pid_t pid, std::uint32_t fence_fd, PeerFence* out, std::string* why) {
  const int fd = duplicate_fd(pid, static_cast<int>(fence_fd));
  if (fd < 0) {
    *why = fmt::format("its fence table descriptor {} cannot be duplicated: {}", fence_fd,
                       std::strerror(errno));
    return Status::kNotAllowed;
  }
  // Only a file FenceTable made: that name (only our code names a memfd
  // so), shmem, sealed at exactly the table's length.
  char link[64] = {};
  const std::string path = fmt::format("/proc/self/fd/{}", fd);
  const ssize_t n = ::readlink(path.c_str(), link, sizeof(link) - 1);
  struct statfs fs {};
  struct stat file {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (n <= 0 || std::strcmp(link, kFenceLink) != 0 || ::fstatfs(fd, &fs) != 0 ||
      fs.f_type != TMPFS_MAGIC || ::fstat(fd, &file) != 0 ||
      static_cast<std::uint64_t>(file.st_size) != wire::kFenceLen || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    ::close(fd);
    *why = "its fence table descriptor is not a sealed fence table";
    return Status::kMismatch;
  }
  void* map = ::mmap(nullptr, wire::kFenceLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    *why = fmt::format("mmap of its fence table failed: {}", std::strerror(err));
    return Status::kBackend;
  }
  if (!out->adopt(static_cast<std::uint8_t*>(map), ::getpid())) {
    *why = fmt::format("its fence table has no free row (all {} taken)", wire::kFenceRows);
    return Status::kBackend;
  }
  return Status::kSuccess;
}

}  // namespace kvxfer::internal::cma
