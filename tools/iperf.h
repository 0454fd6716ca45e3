// SPDX-License-Identifier: Apache-2.0
// The iperf3 baseline of `kvxfer bench` TCP runs: `iperf3 -s -1` and
// `iperf3 -c ... -J` as a pair on the loopback interface, one connection for
// a few seconds: what one TCP stream moves on this machine, measured by a
// tool everyone knows, in the same run as kvxfer's TCP figures.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace kvxfer::tools {

struct IperfResult {
  bool ran = false;
  std::optional<double> gbps;                // 1e9 bytes/s: end.sum_received.bits_per_second / 8e9
  double seconds = 0;                        // end.sum_received.seconds
  std::uint64_t bytes = 0;                   // end.sum_received.bytes
  std::optional<std::uint64_t> retransmits;  // end.sum_sent.retransmits, when reported
  std::string error;                         // why there is no figure
};

struct IperfRequest {
  std::string host = "127.0.0.1";  // both ends bind / connect here
  int seconds = 3;                 // -t
  std::uint64_t write_len = 1 << 20;  // -l: bytes per write (workloads.md: 1 MiB)
  int streams = 1;                    // -P: connections of one client into one server
  std::uint16_t port = 0;             // the server's; 0: a free one picked here
  std::chrono::seconds timeout{30};
};

// Whether iperf3 is on PATH.
bool iperf3_available();

IperfResult run_iperf3(const IperfRequest& request);

// `pairs` iperf3 pairs (a server and a client process each) at the same
// time: N raw streams to N processes. The sum of their GB/s; an error when
// any pair has no figure.
IperfResult run_iperf3_pairs(const IperfRequest& request, int pairs);

// run_iperf3 with one thread of this process spinning beside it for the
// whole run, as a caller spinning in poll() does: on a machine with few
// cores, what one stream can move when a third thread wants a core.
IperfResult run_iperf3_beside_spinner(const IperfRequest& request);

}  // namespace kvxfer::tools
