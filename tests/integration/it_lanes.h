// SPDX-License-Identifier: Apache-2.0
// UCX_TLS names UCX's transports for the ucx lane only; which lane a peer
// gets is KVXFER_LANES (src/engines/lanes.cc). A test that runs "over tcp"
// between processes on one host means the tcp lane, unless it chose a lane
// itself: with_tls() says so for a TLS string without shared memory.
// "ucx" is the ucx lane, over UCX's tcp transport with puts forced on
// (KVXFER_RMA=on): the only put-capable transport on a host without RDMA.
#pragma once

#include <map>
#include <string>

namespace kvxfer::it {

inline std::map<std::string, std::string> with_tls(std::map<std::string, std::string> config,
                                                   const std::string& tls) {
  if (tls == "ucx") {
    config["TLS"] = "tcp";
    config["KVXFER_LANES"] = "ucx";
    config["KVXFER_RMA"] = "on";
    return config;
  }
  config["TLS"] = tls;
  const bool shared_memory = tls.find("sm") != std::string::npos ||
                             tls.find("shm") != std::string::npos ||
                             tls.find("cma") != std::string::npos;
  if (!shared_memory && config.count("KVXFER_LANES") == 0) config["KVXFER_LANES"] = "tcp";
  return config;
}

// Whether with_tls(tls) runs on a lane between hosts (the tcp or ucx lane),
// and the engine counter `name` of that lane ("cma_" on the same host).
inline bool remote_lane(const std::string& tls) { return tls == "tcp" || tls == "ucx"; }
inline std::string lane_counter(const std::string& tls, const std::string& name) {
  return (tls == "ucx" ? "ucx_" : tls == "tcp" ? "tcp_" : "cma_") + name;
}

}  // namespace kvxfer::it
