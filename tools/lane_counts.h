// SPDX-License-Identifier: Apache-2.0
// Which lane carried a Transport's transfers, from its engine's counters:
// what the bench and the demo print as "the lane", whatever KVXFER_LANES or
// UCX_TLS asked for.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace kvxfer::tools {

// Transfers each lane counted (tcp_writes + tcp_reads, ucx_..., cma_...).
inline std::map<std::string, std::uint64_t> lane_transfers(
    const std::map<std::string, std::uint64_t>& counters) {
  const auto get = [&](const char* key) -> std::uint64_t {
    const auto it = counters.find(key);
    return it != counters.end() ? it->second : 0;
  };
  return {{"tcp", get("tcp_writes") + get("tcp_reads")},
          {"ucx", get("ucx_writes") + get("ucx_reads")},
          {"cma", get("cma_writes") + get("cma_reads")}};
}

// The one lane that counted transfers ("tcp", "ucx", "cma"), "mixed" when
// several did, "" when none did.
inline std::string lane_seen(const std::map<std::string, std::uint64_t>& transfers) {
  std::string seen;
  for (const auto& [name, count] : transfers) {
    if (count == 0) continue;
    if (!seen.empty()) return "mixed";
    seen = name;
  }
  return seen;
}

}  // namespace kvxfer::tools
