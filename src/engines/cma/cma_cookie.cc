#include "engines/cma/cma_cookie.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include <cerrno>
#include <stdexcept>

#include "engines/lanes.h"

namespace kvxfer::internal::cma {

PidNamespace own_pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return {};
  return {static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino)};
}

Cookie::Cookie() {
  void* page =
      ::mmap(nullptr, kPageLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) throw std::runtime_error("kvxfer UCX: mmap of the cookie page failed");
  word_ = static_cast<std::uint64_t*>(page);
  while (epoch_ == 0) epoch_ = random_u64();
  *word_ = epoch_;
}

void Cookie::retire() {
  if (word_ == nullptr) return;
  *word_ = 0;
  ::munmap(word_, kPageLen);
  word_ = nullptr;
}

Status read_cookie(pid_t pid, std::uint64_t addr, std::uint64_t epoch, int* err) {
  std::uint64_t value = 0;
  iovec local{&value, sizeof(value)};
  iovec remote{reinterpret_cast<void*>(addr), sizeof(value)};
  const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  *err = n < 0 ? errno : 0;
  if (n == static_cast<ssize_t>(sizeof(value))) {
    return value == epoch ? Status::kSuccess : Status::kRemoteDisconnect;
  }
  if (n < 0 && (errno == ESRCH || errno == EFAULT)) return Status::kRemoteDisconnect;
  if (n < 0 && errno == EPERM) return Status::kNotAllowed;
  return Status::kBackend;
}

}  // namespace kvxfer::internal::cma
