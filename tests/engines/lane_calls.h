// SPDX-License-Identifier: Apache-2.0
// Calls on one lane (engines/lane.h) the way the engine makes them, for
// tests that drive a lane of this process directly: connect through the
// target lane's published blob, and posts from index lists.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine.h"
#include "engines/cma/cma_lane.h"
#include "engines/lane.h"
#include "wire/peer_blob.h"

namespace kvxfer::internal::test {

// Connects `source` to the same-host lane `target` (its pool `remote`);
// `notify`: offer the target's notification socket (else none).
inline Status connect_lane(Lane& source, const cma::CmaLane& target, const RemoteRegion& remote,
                           PeerHandle* peer, std::string* why, bool notify = true) {
  wire::PeerBlob blob;
  target.publish(blob);
  blob.cookie_epoch = target.cookie_epoch();
  if (!notify) blob.notify_fd = wire::kNoNotifyFd;
  Lane::Connected connected;
  const Status st = source.connect(blob, remote, &connected);
  if (st == Status::kSuccess) *peer = handle_of(connected.peer);
  *why = connected.reason;
  return st;
}

inline Status disconnect_lane(Lane& lane, PeerHandle peer) {
  return lane.disconnect(lane_peer(peer));
}

// `block_len`: the pools' (the lane does not know blocks, only byte runs).
inline Status post_blocks(Lane& lane, std::uint64_t block_len, TransferOp op, PeerHandle peer,
                          TransferId id,
                          std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                          XferHandle* out, std::span<const std::uint8_t> note = {}) {
  std::vector<BlockRun> runs(local.size());
  runs.resize(encode_runs(local, remote, runs.data()));
  std::vector<ByteRun> bytes(runs.size());
  block_runs_to_bytes(runs, block_len, bytes.data());
  return lane.post(lane_peer(peer), Post{op, id, bytes, local.size() * block_len, note}, out);
}

inline Status post_write(Lane& lane, std::uint64_t block_len, PeerHandle peer, TransferId id,
                         std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                         XferHandle* out, std::span<const std::uint8_t> note = {}) {
  return post_blocks(lane, block_len, TransferOp::kWrite, peer, id, local, remote, out, note);
}

inline Status post_read(Lane& lane, std::uint64_t block_len, PeerHandle peer, TransferId id,
                        std::span<const std::int64_t> local, std::span<const std::int64_t> remote,
                        XferHandle* out, std::span<const std::uint8_t> note = {}) {
  return post_blocks(lane, block_len, TransferOp::kRead, peer, id, local, remote, out, note);
}

inline Status post_notify(Lane& lane, PeerHandle peer, TransferId id,
                          std::span<const std::uint8_t> message, XferHandle* out) {
  return lane.post(lane_peer(peer), Post{TransferOp::kNotify, id, {}, 0, message}, out);
}

}  // namespace kvxfer::internal::test
