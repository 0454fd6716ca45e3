// SPDX-License-Identifier: Apache-2.0
// `kvxfer startup`: where the time of a Transport's construction goes
// (issue 11, target 6). Times whole Transports as the bench makes them
// (--tls), with and without the progress thread, with the UCX lane forced on
// and off (KVXFER_RMA), and on the loopback engine (the core alone); each row
// names the lanes it built. Touches only the Transports it makes.
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
