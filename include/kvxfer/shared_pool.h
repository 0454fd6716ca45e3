// SPDX-License-Identifier: Apache-2.0
// kvxfer::SharedPool: pool memory that peers on the same host can map.
//
// A same-host peer normally copies into (and out of) our pool with
// process_vm_writev/readv, which pins every page it touches on each call and
// so runs well below memory speed on virtual machines. When our Region lies
// inside a SharedPool, the pool's pages are a sealed memfd: a same-host peer
// (with the ptrace permission process_vm_writev needs anyway) maps it once
// at registration and copies with memcpy. Nothing else changes: the same
// checks, fences and failure reports apply, and any other memory works as
// before.
#pragma once

#include <cstddef>

namespace kvxfer {

class SharedPool {
 public:
  // `bytes` (rounded up to whole pages) of zeroed, page-aligned memory.
  // Throws std::system_error when the memory cannot be had, and
  // std::invalid_argument for zero bytes.
  explicit SharedPool(std::size_t bytes);
  ~SharedPool();
  SharedPool(SharedPool&& other) noexcept;
  SharedPool& operator=(SharedPool&& other) noexcept;
  SharedPool(const SharedPool&) = delete;
  SharedPool& operator=(const SharedPool&) = delete;

  [[nodiscard]] void* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  void reset() noexcept;

  void* data_ = nullptr;
  std::size_t size_ = 0;    // bytes asked for
  std::size_t mapped_ = 0;  // bytes mapped: size_ rounded up to pages
  int fd_ = -1;
};

}  // namespace kvxfer
