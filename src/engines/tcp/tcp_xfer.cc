// SPDX-License-Identifier: Apache-2.0
// The frames a post builds on the caller's thread (wire/tcp_frame.h): per
// wire::kMaxRuns runs one write or read-request frame whose payload is sent
// straight from the pool, then the notification. Touches the handle only.
#include "engines/tcp/tcp_xfer.h"

#include <algorithm>
#include <cstring>

#include "wire/tcp_frame.h"

namespace kvxfer::internal::tcp {

void Xfer::frame(const Post& post, const Region& pool, std::uint64_t remote_block_len) {
  const std::span<const std::uint8_t> note = post.note;
  // `wire` is sized once, so the iovecs into it stay valid.
  const std::size_t runs = post.runs.size();
  const std::size_t frames = (runs + wire::kMaxRuns - 1) / wire::kMaxRuns;
  wire.resize(frames * wire::kHeaderLen + runs * wire::kRunLen +
              (has_notify ? wire::kHeaderLen + note.size() : 0));
  iov.reserve(frames + (read ? 0 : runs) + 1);
  if (read) {
    read_iov.reserve(runs);
    parts.reserve(frames);
  }
  std::uint8_t* at = wire.data();
  for (std::size_t first = 0; first < runs; first += wire::kMaxRuns) {
    const std::size_t count = std::min(wire::kMaxRuns, runs - first);
    at = frame_runs(at, post.runs.subspan(first, count), first + count == runs, pool,
                    remote_block_len);
  }
  if (has_notify) {
    wire::encode_header(at, wire::FrameHeader{wire::FrameType::kNotify, 0, 0, 0, seq, note.size()});
    std::memcpy(at + wire::kHeaderLen, note.data(), note.size());
    iov.push_back(iovec{at, wire::kHeaderLen + note.size()});
  }
}

std::uint8_t* Xfer::frame_runs(std::uint8_t* at, std::span<const BlockRun> runs, bool last,
                               const Region& pool, std::uint64_t remote_block_len) {
  std::uint8_t* const header = at;
  at += wire::kHeaderLen;
  iov.push_back(iovec{header, wire::kHeaderLen + runs.size() * wire::kRunLen});
  if (read) parts.push_back(Part{read_iov.size(), 0, 0});
  auto* base = static_cast<std::uint8_t*>(pool.base);
  std::uint64_t bytes = 0;
  for (const BlockRun& run : runs) {
    const std::uint64_t len = run.count * pool.block_len;
    wire::put_run_at(at, static_cast<std::uint64_t>(run.remote) * remote_block_len, len);
    at += wire::kRunLen;
    const iovec from_pool{base + static_cast<std::uint64_t>(run.local) * pool.block_len, len};
    if (read) {
      read_iov.push_back(from_pool);
      ++parts.back().count;
    } else {
      iov.push_back(from_pool);
    }
    bytes += len;
  }
  if (read) parts.back().bytes = bytes;
  // A transfer's frames come together: all but the last say kMore; the last
  // of a write with a notification says the notification follows.
  const std::uint16_t flags = last ? (has_notify && !read ? wire::kNotifyFollows : 0)
                                   : static_cast<std::uint16_t>(wire::kMore);
  wire::encode_header(
      header, wire::FrameHeader{read ? wire::FrameType::kReadReq : wire::FrameType::kWrite, flags,
                                static_cast<std::uint32_t>(runs.size()), 0, seq, bytes});
  return at;
}

std::size_t Xfer::held_bytes() const {
  return wire.capacity() + (iov.capacity() + read_iov.capacity()) * sizeof(iovec) +
         parts.capacity() * sizeof(Part);
}

void Xfer::reset() {
  peer.reset();
  id = 0;
  seq = 0;
  read = false;
  has_notify = false;
  wire.clear();
  iov.clear();
  read_iov.clear();
  parts.clear();
  result.store(Status::kInProgress, std::memory_order_relaxed);
  why = nullptr;
  refs.store(2, std::memory_order_relaxed);
  released.store(false, std::memory_order_relaxed);
  io_uses = 0;
  io_ref = true;
}

}  // namespace kvxfer::internal::tcp
