// SPDX-License-Identifier: Apache-2.0
// `kvxfer startup`: where the time of a Transport's construction goes
// (issue 11, target 6). Times the UCX steps the engine makes, one by one,
// on their own (config read, ucp_init, worker create, mem_map of the pool,
// rkey pack, worker address), then whole Transports with and without the
// progress thread and on the loopback engine, so what is left is ours.
#pragma once

#include <cstdint>
#include <string>

namespace kvxfer::tools {

struct StartupArgs {
  std::uint64_t region = 1ull << 30;
  std::string tls = "sm";  // sm | tcp | a UCX_TLS string | "" (UCX default)
  int reps = 10;
  std::string json_path;
};

int run_startup(const StartupArgs& args);

}  // namespace kvxfer::tools
