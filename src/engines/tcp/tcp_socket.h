// SPDX-License-Identifier: Apache-2.0
// The tcp lane's sockets: the listener a lane opens at creation, the
// addresses it publishes, and the connection an initiator opens to a peer.
// Plain POSIX calls; no framing (that is wire/tcp_frame.h) and no state.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engines/tcp/tcp_config.h"
#include "wire/peer_blob.h"

namespace kvxfer::internal::tcp {

// Keepalive turns a silent idle peer (host gone, link cut) into a closed
// connection, hence REMOTE_DISCONNECT: 5 s idle, then 5 probes 1 s apart.
// TCP_USER_TIMEOUT bounds data left unacknowledged the same way. A transfer
// in flight is bounded by stall_timeout as well (docs/reliability.md).
inline constexpr int kKeepIdleSeconds = 5;
inline constexpr int kKeepIntervalSeconds = 1;
inline constexpr int kKeepCount = 5;
inline constexpr unsigned kUserTimeoutMs = 10000;

// A listening, non-blocking IPv4 socket on settings.address (or every
// interface) and a port of settings' range (or one the kernel picks); *port
// is the port it took. Throws std::runtime_error saying why when none could
// be opened.
[[nodiscard]] int open_listener(const TcpSettings& settings, std::uint16_t* port);

// What a listener on settings.address publishes: that address, or the IPv4
// addresses of every interface that is up, loopback last.
[[nodiscard]] std::vector<wire::TcpAddress> published_addresses(const TcpSettings& settings);

// Connects to the first of `addresses` that answers within `timeout` (each),
// skipping loopback addresses unless `same_host`, and returns the socket,
// blocking, tuned (tune()). -1 when none answered; *why then says what each
// attempt got.
[[nodiscard]] int connect_any(const std::vector<wire::TcpAddress>& addresses, std::uint16_t port,
                              bool same_host, std::chrono::milliseconds timeout, std::string* why);

// TCP_NODELAY, keepalive and TCP_USER_TIMEOUT as above, close-on-exec.
void tune(int fd);

// What a target's connection may hold in its kernel send queue (SO_SNDBUF,
// which the kernel doubles for its bookkeeping and caps at
// net.core.wmem_max): a peer that asks for replies and never reads them
// pins this much kernel memory at most, not the autotuned 4 MiB (tcp_wmem)
// that 500 such connections took to 1.77 GiB. Set on accepted sockets only:
// an initiator's connections are its own registrations.
inline constexpr int kTargetSendBuffer = 1 << 20;
void cap_send_buffer(int fd);

// Sets O_NONBLOCK on or off.
void set_nonblocking(int fd, bool on);

// Reads exactly `len` bytes from a blocking socket within `timeout`; false
// on EOF, an error or the timeout.
[[nodiscard]] bool read_exactly(int fd, void* buf, std::size_t len,
                                std::chrono::milliseconds timeout);

// Writes all `len` bytes to a blocking socket; false on an error.
[[nodiscard]] bool write_all(int fd, const void* buf, std::size_t len);

}  // namespace kvxfer::internal::tcp
