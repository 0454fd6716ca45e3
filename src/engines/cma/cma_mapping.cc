// SPDX-License-Identifier: Apache-2.0
#include "engines/cma/cma_mapping.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>

namespace kvxfer::internal::cma {

PeerPoolMapping::PeerPoolMapping(PeerPoolMapping&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      map_len_(std::exchange(other.map_len_, 0)),
      pool_(std::exchange(other.pool_, nullptr)),
      remote_base_(std::exchange(other.remote_base_, 0)),
      cookie_(std::exchange(other.cookie_, nullptr)),
      cookie_len_(std::exchange(other.cookie_len_, 0)) {}

PeerPoolMapping& PeerPoolMapping::operator=(PeerPoolMapping&& other) noexcept {
  if (this != &other) {
    reset();
    map_ = std::exchange(other.map_, nullptr);
    map_len_ = std::exchange(other.map_len_, 0);
    pool_ = std::exchange(other.pool_, nullptr);
    remote_base_ = std::exchange(other.remote_base_, 0);
    cookie_ = std::exchange(other.cookie_, nullptr);
    cookie_len_ = std::exchange(other.cookie_len_, 0);
  }
  return *this;
}

void PeerPoolMapping::reset() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_len_);
  if (cookie_ != nullptr) ::munmap(const_cast<std::uint8_t*>(cookie_), cookie_len_);
  cookie_ = nullptr;
  cookie_len_ = 0;
  map_ = nullptr;
  map_len_ = 0;
  pool_ = nullptr;
  remote_base_ = 0;
}

int duplicate_fd(pid_t pid, int fd) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return -1;
  const int dup = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
  const int err = errno;
  ::close(pidfd);
  if (dup >= 0) ::fcntl(dup, F_SETFD, FD_CLOEXEC);
  errno = err;
  return dup;
}

namespace {

// What /proc/<pid>/maps says of the mapping that holds `addr`.
struct MapsLine {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  char perms[5] = {};
  std::uint64_t offset = 0;
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  std::uint64_t inode = 0;
};

// True when a mapping of `pid` holds `addr`; fills *out.
bool find_mapping(pid_t pid, std::uint64_t addr, MapsLine* out) {
  const std::string path = fmt::format("/proc/{}/maps", pid);
  std::FILE* maps = std::fopen(path.c_str(), "re");
  if (maps == nullptr) return false;
  bool found = false;
  char line[512];
  while (std::fgets(line, sizeof(line), maps) != nullptr) {
    MapsLine m;
    if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s %" SCNx64 " %x:%x %" SCNu64, &m.start,
                    &m.end, m.perms, &m.offset, &m.dev_major, &m.dev_minor, &m.inode) != 7) {
      // A line longer than the buffer continues on the next read; it never
      // starts with an address range, so it is skipped here.
      continue;
    }
    if (m.start > addr) break;
    if (addr < m.end) {
      *out = m;
      found = true;
      break;
    }
  }
  std::fclose(maps);
  return found;
}

// Our duplicate of descriptor `fd_number` of `pid`, once the kernel says it
// is a sealed shmem file (so a mapping of it can never fault) that `pid`
// maps shared at `addr`, from file offset `offset`, holding [addr, addr +
// bytes) in one mapping. `writable`: not sealed against writes either.
// Otherwise -1, with *st and *why saying which check failed (`what` names
// the file in the reason).
int checked_file(pid_t pid, std::uint32_t fd_number, std::uint64_t addr, std::uint64_t bytes,
                 std::uint64_t offset, bool writable, const char* what, Status* st,
                 std::string* why) {
  const int fd = duplicate_fd(pid, static_cast<int>(fd_number));
  if (fd < 0) {
    *st = Status::kNotAllowed;
    *why = fmt::format("its {} descriptor {} cannot be duplicated: {}", what, fd_number,
                       std::strerror(errno));
    return -1;
  }
  const auto refuse = [&](std::string reason) {
    ::close(fd);
    *st = Status::kMismatch;
    *why = std::move(reason);
    return -1;
  };
  struct statfs fs {};
  struct stat file {};
  if (::fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC || ::fstat(fd, &file) != 0 ||
      !S_ISREG(file.st_mode)) {
    return refuse(fmt::format("its {} descriptor is not a shared-memory file", what));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return refuse(fmt::format("its {} memfd is not sealed against shrinking", what));
  }
  if (writable && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return refuse(fmt::format("its {} memfd is sealed against writing", what));
  }
  const auto size = static_cast<std::uint64_t>(file.st_size);
  if (offset > size || bytes > size - offset) {
    return refuse(fmt::format("its {} memfd holds {} bytes, not {} from offset {}", what, size,
                              bytes, offset));
  }
  // The kernel's account of the target's memory: one shared mapping of
  // this very file, at the declared offset, holding all of it.
  MapsLine m;
  if (!find_mapping(pid, addr, &m) || addr + bytes > m.end || m.perms[3] != 's' ||
      m.inode != file.st_ino || m.dev_major != major(file.st_dev) ||
      m.dev_minor != minor(file.st_dev) || m.offset + (addr - m.start) != offset) {
    return refuse(
        fmt::format("its {} descriptor is not the file mapped at its declared address", what));
  }
  return fd;
}

}  // namespace

Status map_peer_pool(pid_t pid, const Declaration& declared, std::uint64_t cookie_addr,
                     bool populate, PeerPoolMapping* out, std::string* why) {
  const std::uint64_t bytes = declared.num_blocks * declared.block_len;  // no overflow: decoded
  const std::uint64_t base = declared.base_addr;
  Status st = Status::kSuccess;
  const int fd = checked_file(pid, declared.pool_fd, base, bytes, declared.pool_offset,
                              /*writable=*/true, "pool", &st, why);
  if (fd < 0) return st;
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t map_offset = declared.pool_offset / page * page;
  const std::uint64_t lead = declared.pool_offset - map_offset;
  const std::size_t map_len = (lead + bytes + page - 1) / page * page;
  void* map = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     static_cast<off_t>(map_offset));
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    *why = fmt::format("mmap of its pool failed: {}", std::strerror(err));
    return Status::kBackend;
  }
  // Every page table entry now rather than one fault per page on the first
  // copy through it. Best effort: kernels before 5.14 do not know the
  // advice, and then pages fault in as they are first copied.
  if (populate) static_cast<void>(::madvise(map, map_len, MADV_POPULATE_WRITE));
  out->reset();
  out->map_ = map;
  out->map_len_ = map_len;
  out->pool_ = static_cast<std::uint8_t*>(map) + lead;
  out->remote_base_ = base;

  // The cookie page too, read-only, when it checks out: the epoch can then
  // be read before each chunk without a system call. Without it the lane
  // reads the epoch with process_vm_readv, as for any peer.
  if (declared.cookie_fd != wire::kNoFd) {
    std::string cookie_why;
    const int cfd = checked_file(pid, declared.cookie_fd, cookie_addr, wire::kCookieLen, 0,
                                 /*writable=*/false, "cookie", &st, &cookie_why);
    void* cookie = MAP_FAILED;
    if (cfd >= 0) {
      cookie = ::mmap(nullptr, page, PROT_READ, MAP_SHARED, cfd, 0);
      ::close(cfd);
    }
    if (cookie != MAP_FAILED) {
      out->cookie_ = static_cast<const std::uint8_t*>(cookie);
      out->cookie_len_ = page;
    } else {
      *why = cfd >= 0 ? "mmap of its cookie page failed" : cookie_why;
    }
  }
  return Status::kSuccess;
}

}  // namespace kvxfer::internal::cma
