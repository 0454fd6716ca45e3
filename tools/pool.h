// A page-aligned pool, every page touched before use: anonymous memory, or
// a kvxfer::SharedPool (which same-host peers map and copy into with
// memcpy) when the environment has KVXFER_BENCH_POOL=shared. `kvxfer bench
// --pool shared` sets it, so that the targets and initiators it starts
// inherit it.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvxfer/shared_pool.h"

namespace kvxfer::tools {

inline constexpr const char* kPoolEnv = "KVXFER_BENCH_POOL";

// True when pools are to be SharedPools (kPoolEnv is "shared").
inline bool shared_pools_requested() {
  const char* v = std::getenv(kPoolEnv);
  return v != nullptr && std::string_view(v) == "shared";
}

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
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      throw std::runtime_error("cannot map a pool of " + std::to_string(bytes) + " bytes");
    }
    data_ = static_cast<std::uint8_t*>(p);
  }
  ~Pool() {
    if (!shared_) ::munmap(data_, bytes_);
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  [[nodiscard]] std::uint8_t* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return bytes_; }
  [[nodiscard]] bool shared() const { return shared_ != nullptr; }

 private:
  std::size_t bytes_;
  std::uint8_t* data_ = nullptr;
  std::unique_ptr<SharedPool> shared_;
};

}  // namespace kvxfer::tools
