// SPDX-License-Identifier: Apache-2.0
// `kvxfer peers`: what a registered peer costs (issue 11, target 7).
//
// Registers many peers on one initiator Transport and measures, at each
// checkpoint: add_remote_peer p50/p99, malloc heap, RSS and file
// descriptors per peer, and the cost of a scoped poll(peer) with a few
// transfers in flight, which must not grow with the number of peers. Two
// engines: LOOPBACK (in-process targets) and UCX over TCP against real
// `kvxfer target` processes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvxfer::tools {

struct PeersArgs {
  std::vector<int> loopback = {1, 64, 1000};  // checkpoints; empty: skip
  std::vector<int> tcp = {1, 8, 64};          // checkpoints (target processes); empty: skip
  std::uint64_t region = 64ull << 20;         // each target's pool
  std::uint64_t block_len = 64 << 10;
  int poll_reps = 2000;  // timed polls per checkpoint
  std::string json_path;
  std::string plot_path;
  bool quiet = false;
};

int run_peers_bench(const PeersArgs& args);

}  // namespace kvxfer::tools
