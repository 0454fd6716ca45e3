// SPDX-License-Identifier: Apache-2.0
// The tcp lane's settings from its keys (KVXFER_TCP_ADDRESS,
// KVXFER_TCP_PORTS, KVXFER_TCP_STALL_MS, KVXFER_TCP_ENCRYPT, handed over
// by engines/settings.h). A pure function, so every rule is tested without
// a lane.
#pragma once

#include <cstdint>
#include <string>

#include "engines/settings.h"

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
  // KVXFER_TCP_STALL_MS: how long a target waits on a connection that owes
  // it the rest of a frame, or does not read the answers it asked for,
  // before it closes it (30 s: Options::stall_timeout's default).
  std::uint32_t stall_ms = 30000;
  // KVXFER_TCP_ENCRYPT: on carries every connection over TLS 1.3 after the
  // handshake (tcp_tls.h); both ends must say the same, or the hello is
  // refused. Off (the default): frames are authenticated, the payload is
  // cleartext.
  bool encrypt = false;

  friend bool operator==(const TcpSettings&, const TcpSettings&) = default;
};

// Throws std::runtime_error, naming the setting and where it came from, for
// an address that is not a dotted IPv4 address (or is 0.0.0.0), and a port
// range that is not N or LOW-HIGH with 1 <= LOW <= HIGH <= 65535, and a
// stall outside 100..3600000 milliseconds, and an encryption that is not on
// or off.
[[nodiscard]] TcpSettings compute_tcp_settings(const TcpKeys& keys);

}  // namespace kvxfer::internal::tcp
