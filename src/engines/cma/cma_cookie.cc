#include "engines/cma/cma_cookie.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <cerrno>
#include <stdexcept>

#include "engines/lanes.h"

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

}  // namespace

PidNamespace own_pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return {};
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

Cookie::Cookie(const Region& pool) {
  static_assert(sizeof(Declaration) <= kPageLen && kPageLen % kAlign == 0);
  void* page =
      ::mmap(nullptr, kPageLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw std::runtime_error("kvxfer UCX: mmap of the cookie page failed");
  page_ = static_cast<Declaration*>(page);
  while (epoch_ == 0) epoch_ = random_u64();
  *page_ = Declaration{epoch_, reinterpret_cast<std::uintptr_t>(pool.base), pool.num_blocks,
                       pool.block_len};
}

void Cookie::retire() {
  if (page_ == nullptr) return;
  *page_ = Declaration{};
  ::munmap(page_, kPageLen);
  page_ = nullptr;
}

Status read_cookie(pid_t pid, std::uint64_t addr, std::uint64_t epoch, int* err) {
  std::uint64_t value = 0;
  const Status st = read_words(pid, addr, &value, sizeof(value), err);
  if (st != Status::kSuccess) return st;
  return value == epoch ? Status::kSuccess : Status::kRemoteDisconnect;
}

Status read_declaration(pid_t pid, std::uint64_t addr, Declaration* out, int* err) {
  *err = 0;
  if (addr % Cookie::kAlign != 0) return Status::kMismatch;
  return read_words(pid, addr, out, sizeof(*out), err);
}

}  // namespace kvxfer::internal::cma
