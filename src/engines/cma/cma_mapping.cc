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
      remote_base_(std::exchange(other.remote_base_, 0)) {}

PeerPoolMapping& PeerPoolMapping::operator=(PeerPoolMapping&& other) noexcept {
  if (this != &other) {
    reset();
    map_ = std::exchange(other.map_, nullptr);
    map_len_ = std::exchange(other.map_len_, 0);
    pool_ = std::exchange(other.pool_, nullptr);
    remote_base_ = std::exchange(other.remote_base_, 0);
  }
  return *this;
}

void PeerPoolMapping::reset() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_len_);
  map_ = nullptr;
  map_len_ = 0;
  pool_ = nullptr;
  remote_base_ = 0;
}

namespace {

// The descriptor `fd` of process `pid`, duplicated into ours; -1 with errno.
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

}  // namespace

Status map_peer_pool(pid_t pid, const Declaration& declared, bool populate, PeerPoolMapping* out,
                     std::string* why) {
  const std::uint64_t bytes = declared.num_blocks * declared.block_len;  // no overflow: decoded
  const int fd = duplicate_fd(pid, static_cast<int>(declared.pool_fd));
  if (fd < 0) {
    *why = fmt::format("its pool descriptor {} cannot be duplicated: {}", declared.pool_fd,
                       std::strerror(errno));
    return Status::kNotAllowed;
  }
  const auto refuse = [&](Status st, std::string reason) {
    ::close(fd);
    *why = std::move(reason);
    return st;
  };
  struct statfs fs {};
  struct stat st {};
  if (::fstatfs(fd, &fs) != 0 || fs.f_type != TMPFS_MAGIC || ::fstat(fd, &st) != 0 ||
      !S_ISREG(st.st_mode)) {
    return refuse(Status::kMismatch, "its pool descriptor is not a shared-memory file");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return refuse(Status::kMismatch, "its pool's memfd is not sealed against shrinking");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return refuse(Status::kMismatch, "its pool's memfd is sealed against writing");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (declared.pool_offset > size || bytes > size - declared.pool_offset) {
    return refuse(Status::kMismatch,
                  fmt::format("its pool's memfd holds {} bytes, not {} from offset {}", size, bytes,
                              declared.pool_offset));
  }
  // The kernel's account of the target's pool: one shared mapping of this
  // very file, at the declared offset, holding the whole pool.
  MapsLine m;
  const std::uint64_t base = declared.base_addr;
  if (!find_mapping(pid, base, &m) || base + bytes > m.end || m.perms[3] != 's' ||
      m.inode != st.st_ino || m.dev_major != major(st.st_dev) || m.dev_minor != minor(st.st_dev) ||
      m.offset + (base - m.start) != declared.pool_offset) {
    return refuse(Status::kMismatch,
                  "its pool descriptor is not the file mapped at its declared pool address");
  }
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
  return Status::kSuccess;
}

}  // namespace kvxfer::internal::cma
