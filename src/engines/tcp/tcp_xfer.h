// SPDX-License-Identifier: Apache-2.0
// What a post hands the tcp lane's I/O thread: the peer it goes to and the
// transfer handle whose frames it builds on the caller's thread (framing in
// tcp_xfer.cc). Uses the wire formats and engine.h; no lock of its own.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine.h"
#include "engines/lane.h"
#include "kvxfer/status.h"

namespace kvxfer::internal::tcp {

class Conn;

// A peer this lane connected (initiator side).
struct Peer : LanePeer, std::enable_shared_from_this<Peer> {
  explicit Peer(Lane* owner) : LanePeer(owner) {}
  std::string name;
  std::uint64_t remote_block_len = 0;
  Conn* conn = nullptr;  // owned by the I/O thread; only its identity is used here
  std::atomic<bool> dead{false};
  std::atomic<std::uint64_t> next_seq{1};
  // Set by the I/O thread while this peer's connection has bytes waiting to
  // go out (EPOLLOUT armed): the thread comes back to it on its own, so a
  // post behind them needs no wake (Commands::submit()).
  std::atomic<bool> sending{false};
};

// A transfer handle. The core holds one reference until release(), the I/O
// thread one until the transfer ended and nothing of it is queued or awaited.
// Handles are reused with their buffers (Commands), so a post allocates
// nothing of its own once warm.
struct Xfer : LaneXfer {
  explicit Xfer(Lane* owner) : LaneXfer(owner) {}

  // Writes the frames of `post` (its runs, then its notification) into
  // `wire` and lists what to send in `iov` (and a read's replies in
  // `read_iov` and `parts`): pieces of `pool`, our region, and of the
  // peer's blocks of `remote_block_len` bytes. peer, seq, read and
  // has_notify are set first.
  void frame(const Post& post, const Region& pool, std::uint64_t remote_block_len);
  // The bytes its buffers hold, and the handle as new with them kept.
  [[nodiscard]] std::size_t held_bytes() const;
  void reset();

  std::shared_ptr<Peer> peer;
  TransferId id = 0;
  std::uint64_t seq = 0;
  bool read = false;
  bool has_notify = false;
  // The frames' headers, runs and message, and what to send, in order
  // (pieces of `wire` and, for writes, of our pool).
  std::vector<std::uint8_t> wire;
  std::vector<iovec> iov;
  // A read's replies: per request frame, the part of `read_iov` (our pool)
  // its reply fills and that part's bytes.
  struct Part {
    std::size_t first = 0;
    std::size_t count = 0;
    std::uint64_t bytes = 0;
  };
  std::vector<iovec> read_iov;
  std::vector<Part> parts;
  std::atomic<Status> result{Status::kInProgress};
  const char* why = nullptr;  // written before `result` turns final
  std::atomic<int> refs{2};
  std::atomic<bool> released{false};
  // I/O thread only: queue entries and awaited answers still naming this
  // transfer; the I/O thread lets go once the transfer ended and this is 0.
  int io_uses = 0;
  bool io_ref = true;

 private:
  // One write or read-request frame of at most wire::kMaxRuns runs at `at`;
  // returns where the next frame starts.
  std::uint8_t* frame_runs(std::uint8_t* at, std::span<const BlockRun> runs, bool last,
                           const Region& pool, std::uint64_t remote_block_len);
};

}  // namespace kvxfer::internal::tcp
