// SPDX-License-Identifier: Apache-2.0
// UCX_TLS names UCX's transports for the ucx lane only; which lane a peer
// gets is KVXFER_LANES (src/engines/lanes.cc). A test that runs "over tcp"
// between processes on one host means the tcp lane, unless it chose a lane
// itself: with_tls() says so for a TLS string without shared memory.
#pragma once

#include <map>
#include <string>

namespace kvxfer::it {

inline std::map<std::string, std::string> with_tls(std::map<std::string, std::string> config,
                                                   const std::string& tls) {
  config["TLS"] = tls;
  const bool shared_memory = tls.find("sm") != std::string::npos ||
                             tls.find("shm") != std::string::npos ||
                             tls.find("cma") != std::string::npos;
  if (!shared_memory && config.count("KVXFER_LANES") == 0) config["KVXFER_LANES"] = "tcp";
  return config;
}

}  // namespace kvxfer::it
