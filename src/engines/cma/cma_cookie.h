// How a same-host peer proves it still is the agent that published its
// metadata: a cookie page it keeps while its engine is up, read back with
// process_vm_readv; and the pid namespace both sides must share.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "kvxfer/status.h"

namespace kvxfer::internal::cma {

struct PidNamespace {
  std::uint64_t dev = 0;
  std::uint64_t ino = 0;
};

// This process's pid namespace, or {0, 0} where it cannot be read.
PidNamespace own_pid_namespace();

// A page holding a random epoch while the engine is up. Peers on this host
// read it back before and after each write: a pid that was reused, or an
// engine that shut down (page unmapped or cleared), no longer matches.
class Cookie {
 public:
  Cookie();
  ~Cookie() { retire(); }
  Cookie(const Cookie&) = delete;
  Cookie& operator=(const Cookie&) = delete;

  [[nodiscard]] std::uint64_t addr() const { return reinterpret_cast<std::uintptr_t>(word_); }
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }

  void retire();

 private:
  static constexpr std::size_t kPageLen = 4096;
  std::uint64_t* word_ = nullptr;
  std::uint64_t epoch_ = 0;
};

// kSuccess when `pid` is the agent that published (addr, epoch); otherwise
// kRemoteDisconnect (gone, or its engine shut down), kNotAllowed (no ptrace
// permission, e.g. Yama) or kBackend. *err: the errno, or 0.
Status read_cookie(pid_t pid, std::uint64_t addr, std::uint64_t epoch, int* err);

}  // namespace kvxfer::internal::cma
