// SPDX-License-Identifier: Apache-2.0
// The tcp lane's settings, read from the user's engine_config (keys
// KVXFER_TCP_*; the other lanes leave them to this one) with the environment
// variable of the same name as a fallback. A pure function, so every rule
// is tested without a lane.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kvxfer::internal::tcp {

struct TcpSettings {
  // KVXFER_TCP_ADDRESS: the IPv4 address the lane listens on and publishes.
  // Empty (the default): every interface; the metadata then lists the
  // addresses of every interface that is up, loopback last (peers on other
  // hosts skip loopback).
  std::string address;
  // KVXFER_TCP_PORTS: "N" or "LOW-HIGH", the ports the listener may take,
  // tried in order. 0 (the default): a port the kernel picks.
  std::uint16_t port_low = 0;
  std::uint16_t port_high = 0;
};

// Whether an engine_config key is this lane's.
[[nodiscard]] inline bool is_tcp_key(std::string_view key) {
  return key.starts_with("KVXFER_TCP_");
}

// Throws std::runtime_error, naming the key, for an address that is not a
// dotted IPv4 address, a port range that is not N or LOW-HIGH with
// 1 <= LOW <= HIGH <= 65535, or any other KVXFER_TCP_* key.
// `environment` maps the same keys (tests pass their own; the lane passes
// the process environment's).
[[nodiscard]] TcpSettings compute_tcp_settings(
    const std::map<std::string, std::string>& engine_config,
    const std::map<std::string, std::string>& environment);

// KVXFER_TCP_ADDRESS and KVXFER_TCP_PORTS from the process environment.
[[nodiscard]] std::map<std::string, std::string> tcp_environment();

}  // namespace kvxfer::internal::tcp
