// SPDX-License-Identifier: Apache-2.0
// The raw TCP baseline of `kvxfer bench --tls tcp`: one plain TCP stream
// between the same two processes (initiator -> target), pool to pool, to
// quote kvxfer's TCP figures against what a socket alone moves here. Only to
// the target's own address (loopback for a spawned target).
#pragma once

#include <cstdint>
#include <string>

#include "channel.h"

namespace kvxfer::tools {

// Target: listens on `host` (an ephemeral port), for one STREAM. Returns the
// listening socket and fills *port; throws ChannelError.
int listen_for_stream(const std::string& host, std::uint16_t* port);

// Target: accepts one connection on `listen_fd` (closing it) and receives
// exactly `bytes` into dst (wrapping at dst_len). Throws ChannelError on a
// short stream or a timeout.
void receive_stream(int listen_fd, std::uint8_t* dst, std::uint64_t dst_len, std::uint64_t bytes);

// Initiator: connects to where and sends `bytes` from src (wrapping at
// src_len) in writes of `chunk` bytes. Throws ChannelError.
void send_stream(const HostPort& where, const std::uint8_t* src, std::uint64_t src_len,
                 std::uint64_t bytes, std::uint64_t chunk);

// The address of the local end of socket `fd`, or "127.0.0.1" when `fd` is
// not an IPv4 socket (a spawned target's pipes).
std::string local_address_of(int fd);

}  // namespace kvxfer::tools
