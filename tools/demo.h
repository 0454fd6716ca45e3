// SPDX-License-Identifier: Apache-2.0
// `kvxfer demo`: a target spawned on this machine, random blocks written into
// it twice (a first pass into fresh pools, then the steady state), each
// block verified on the target.
#pragma once

#include <cstdint>
#include <string>

namespace kvxfer::tools {

struct DemoArgs {
  std::uint64_t pool_bytes = 1ull << 30;
  std::uint64_t block_len = 64 << 10;
  std::uint64_t blocks = 4096;
  std::uint64_t batch = 64;
  int depth = 4;
  std::uint64_t seed = 0;
  std::string tls = "sm";
};

// Returns the process exit status (0 when every block verified).
int run_demo(const DemoArgs& a);

}  // namespace kvxfer::tools
