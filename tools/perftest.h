// SPDX-License-Identifier: Apache-2.0
// The ucx_perftest baseline: `ucx_perftest -t ucp_put_bw -s <block_len>` as
// a server + client pair on the loopback interface, under the same UCX_TLS
// as the bench (other UCX_* knobs come with the environment), with a bounded
// iteration count and a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace kvxfer::tools {

struct PerftestResult {
  bool ran = false;
  std::optional<double> gbps;  // 1e9 bytes/s, from its overall bandwidth
  std::uint64_t iterations = 0;
  double seconds = 0;  // wall time of the client
  std::string error;   // why there is no figure
};

struct PerftestRequest {
  std::uint64_t message_len = 0;
  std::uint64_t bytes = 0;  // about this much is put (iterations are bounded)
  std::string ucx_tls;      // "" keeps UCX's choice
  std::chrono::seconds timeout{60};
};

PerftestResult run_perftest(const PerftestRequest& request);

// Whether ucx_perftest is on PATH.
bool perftest_available();

// Whether something listens on TCP `port` of this host, from the kernel's
// socket tables (a server that takes one client, like ucx_perftest's or
// iperf3 -s -1, before its client may connect: connecting to find out would
// be taken as the client).
bool port_listening(std::uint16_t port);

class Subprocess;

// Waits until `server` (named `name` in the error) listens on `port`: "" once
// it does, else why not (it exited first, or `deadline` passed).
std::string wait_listening(Subprocess& server, std::uint16_t port,
                           std::chrono::steady_clock::time_point deadline, const std::string& name);

}  // namespace kvxfer::tools
