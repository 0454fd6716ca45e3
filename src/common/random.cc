// SPDX-License-Identifier: Apache-2.0
#include "common/random.h"

#include <pthread.h>
#include <sys/random.h>

#include <array>
#include <utility>

namespace kvxfer::internal {
namespace {

struct RandomSupply {
  std::array<std::uint64_t, 32> values{};
  std::size_t left = 0;
};
thread_local RandomSupply t_random;
void forget_random_in_child() { t_random.left = 0; }

}  // namespace

std::uint64_t fresh_random() {
  static const int atfork = ::pthread_atfork(nullptr, nullptr, &forget_random_in_child);
  static_cast<void>(atfork);
  RandomSupply& supply = t_random;
  for (;;) {
    if (supply.left == 0) {
      const std::size_t bytes = sizeof(supply.values);
      if (::getrandom(supply.values.data(), bytes, 0) != static_cast<ssize_t>(bytes)) {
        const std::uint64_t value = random_u64();  // getrandom unavailable
        if (value != 0) return value;
        continue;
      }
      supply.left = supply.values.size();
    }
    --supply.left;
    const std::uint64_t value = std::exchange(supply.values[supply.left], 0);
    if (value != 0) return value;
  }
}

}  // namespace kvxfer::internal
