// SPDX-License-Identifier: Apache-2.0
// One thread of ours spinning on a core while a baseline is measured beside
// it, as the bench's caller spins in poll() during a case. Touches nothing
// but its own flag.
#pragma once

#include <atomic>
#include <thread>

namespace kvxfer::tools {

class Spinner {
 public:
  Spinner()
      : thread_([this] {
          while (!stop_.load(std::memory_order_relaxed)) {
          }
        }) {}
  ~Spinner() {
    stop_.store(true);
    thread_.join();
  }
  Spinner(const Spinner&) = delete;
  Spinner& operator=(const Spinner&) = delete;

 private:
  std::atomic<bool> stop_{false};  // before thread_: set before the thread reads it
  std::thread thread_;
};

}  // namespace kvxfer::tools
