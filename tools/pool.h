// A page-aligned anonymous pool, every page touched before use.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace kvxfer::tools {

class Pool {
 public:
  explicit Pool(std::size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      throw std::runtime_error("cannot map a pool of " + std::to_string(bytes) + " bytes");
    }
    data_ = static_cast<std::uint8_t*>(p);
  }
  ~Pool() { ::munmap(data_, bytes_); }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  [[nodiscard]] std::uint8_t* data() const { return data_; }
  [[nodiscard]] std::size_t size() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::uint8_t* data_;
};

}  // namespace kvxfer::tools
