// SPDX-License-Identifier: Apache-2.0
#include "kvxfer/shared_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "common/shared_pools.h"

namespace kvxfer {
namespace {

struct Entry {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
  int fd = -1;
};

// Live SharedPools. Entries come and go with pools, which are few and long
// lived; a Transport looks its region up once, when it starts.
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

[[noreturn]] void fail(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

SharedPool::SharedPool(std::size_t bytes) {
  if (bytes == 0) throw std::invalid_argument("kvxfer::SharedPool: zero bytes");
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) throw std::invalid_argument("kvxfer::SharedPool: too many bytes");
  const std::size_t mapped = (bytes + page - 1) / page * page;
  const int fd = ::memfd_create(internal::kSharedPoolName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) fail("kvxfer::SharedPool: memfd_create");
  // Sealed at its size: a peer that maps it can count on every page staying
  // there (a shrunk file would raise SIGBUS in the peer's copy), and checks
  // the seal before it maps.
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail("kvxfer::SharedPool: sizing and sealing the memfd");
  }
  void* data = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    errno = err;
    fail("kvxfer::SharedPool: mmap");
  }
  data_ = data;
  size_ = bytes;
  mapped_ = mapped;
  fd_ = fd;
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  std::lock_guard lock(registry_mu());
  registry().push_back(Entry{begin, begin + mapped, fd});
}

SharedPool::~SharedPool() { reset(); }

SharedPool::SharedPool(SharedPool&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)),
      fd_(std::exchange(other.fd_, -1)) {}

SharedPool& SharedPool::operator=(SharedPool&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void SharedPool::reset() noexcept {
  if (data_ == nullptr) return;
  {
    std::lock_guard lock(registry_mu());
    auto& entries = registry();
    const auto begin = reinterpret_cast<std::uintptr_t>(data_);
    std::erase_if(entries, [&](const Entry& e) { return e.begin == begin; });
  }
  ::munmap(data_, mapped_);
  ::close(fd_);
  data_ = nullptr;
  size_ = 0;
  mapped_ = 0;
  fd_ = -1;
}

namespace internal {

SharedPoolFile find_shared_pool(const void* base, std::uint64_t bytes) {
  const auto begin = reinterpret_cast<std::uintptr_t>(base);
  std::lock_guard lock(registry_mu());
  for (const Entry& e : registry()) {
    if (begin < e.begin || begin >= e.end || bytes > e.end - begin) continue;
    // A duplicate, taken under the lock: it stays valid (and names this
    // memfd) even if the pool is freed and its descriptor number reused.
    const int fd = ::fcntl(e.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return {};
    return SharedPoolFile{fd, begin - e.begin};
  }
  return {};
}

}  // namespace internal
}  // namespace kvxfer
