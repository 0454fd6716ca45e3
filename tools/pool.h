// SPDX-License-Identifier: Apache-2.0
// A page-aligned pool, every page touched before use: anonymous memory; a
// kvxfer::SharedPool (which same-host peers map and copy into with memcpy)
// when the environment has KVXFER_BENCH_POOL=shared; or anonymous memory on
// transparent huge pages (2 MiB-aligned, madvise(MADV_HUGEPAGE) before the
// first touch) when it has KVXFER_BENCH_POOL=huge. `kvxfer bench --pool`
// sets it, so that the targets and initiators it starts inherit it.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvxfer/shared_pool.h"

namespace kvxfer::tools {

inline constexpr const char* kPoolEnv = "KVXFER_BENCH_POOL";

// The pools' kind, from kPoolEnv: "shared", "huge", or "private" (anything
// else).
inline std::string_view pool_kind() {
  const char* v = std::getenv(kPoolEnv);
  const std::string_view kind = v != nullptr ? v : "";
  return kind == "shared" || kind == "huge" ? kind : "private";
}

// True when pools are to be SharedPools (kPoolEnv is "shared").
inline bool shared_pools_requested() { return pool_kind() == "shared"; }

inline constexpr std::size_t kHugePage = std::size_t{2} << 20;

class Pool {
 public:
  explicit Pool(std::size_t bytes) : bytes_(bytes) {
    if (shared_pools_requested()) {
      shared_ = std::make_unique<SharedPool>(bytes);
      data_ = static_cast<std::uint8_t*>(shared_->data());
      // Every page in place now, as MAP_POPULATE does below.
      for (std::size_t i = 0; i < bytes; i += 4096) data_[i] = 0;
      return;
    }
    if (pool_kind() == "huge") {
      // A 2 MiB-aligned start inside a mapping one huge page longer, so
      // that every whole 2 MiB of the pool can be one huge page; the
      // advice comes before the first touch, which then faults in huge
      // pages where the kernel has them (THP "madvise" or "always").
      map_len_ = bytes + kHugePage;
      map_ = map_anonymous(map_len_, 0);
      const auto start =
          (reinterpret_cast<std::uintptr_t>(map_) + kHugePage - 1) & ~(kHugePage - 1);
      data_ = reinterpret_cast<std::uint8_t*>(start);
      if (::madvise(data_, bytes, MADV_HUGEPAGE) != 0) {
        ::munmap(map_, map_len_);
        throw std::runtime_error("madvise(MADV_HUGEPAGE) refused (kernel without THP?)");
      }
      for (std::size_t i = 0; i < bytes; i += 4096) data_[i] = 0;
      return;
    }
    map_len_ = bytes;
    map_ = map_anonymous(map_len_, MAP_POPULATE);
    data_ = static_cast<std::uint8_t*>(map_);
  }
  ~Pool() {
    if (!shared_) ::munmap(map_, map_len_);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  [[nodiscard]] std::uint8_t* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return bytes_; }
  [[nodiscard]] bool shared() const { return shared_ != nullptr; }

  // Bytes of this pool's mapping that are on transparent huge pages now
  // (AnonHugePages of its entry in /proc/self/smaps), 0 when unknown.
  [[nodiscard]] std::uint64_t huge_bytes() const {
    if (shared_) return 0;
    std::ifstream smaps("/proc/self/smaps");
    // The pool's own entry: madvise splits the mapping, and the advised
    // part starts at data_, not map_, unless the kernel aligned the mapping.
    const auto want = reinterpret_cast<std::uintptr_t>(data_);
    bool ours = false;
    std::string line;
    while (std::getline(smaps, line)) {
      std::uintptr_t lo = 0;
      std::uintptr_t hi = 0;
      // A mapping's first line: "lo-hi perms ..." in hex.
      if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) {
        ours = lo <= want && want < hi;
        continue;
      }
      std::uint64_t kib = 0;
      if (ours && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) {
        return std::min<std::uint64_t>(kib << 10, bytes_);  // a merged entry may hold more
      }
    }
    return 0;
  }

 private:
  static void* map_anonymous(std::size_t len, int extra_flags) {
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
    if (p == MAP_FAILED) {
      throw std::runtime_error("cannot map a pool of " + std::to_string(len) + " bytes");
    }
    return p;
  }

  std::size_t bytes_;
  void* map_ = nullptr;
  std::size_t map_len_ = 0;
  std::uint8_t* data_ = nullptr;
  std::unique_ptr<SharedPool> shared_;
};

}  // namespace kvxfer::tools
