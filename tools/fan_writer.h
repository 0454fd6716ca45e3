// SPDX-License-Identifier: Apache-2.0
// One writer of a fan-out or incast run (fan.h): which blocks each of its
// writes moves (Spread), and its loop, which posts them round-robin over its
// peers and polls each one. Fan-out runs one in the bench, incast one in
// each `kvxfer initiator`; it touches only the Transport it is given.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvxfer/transport.h"
#include "timing.h"

namespace kvxfer::tools {

// Which blocks write w moves, for a writer that owns remote blocks
// [first, first + count) of a target: the owned blocks, shuffled once, are
// written `batch` at a time in order and over again; local blocks likewise
// from a shuffled local pool. Writes w and w' touch the same remote blocks
// only when w = w' mod (count / batch); transfers complete in any order, so
// the writer posts w only once w - cycle() has ended, and then the last write
// of every block is known.
class Spread {
 public:
  Spread(std::uint64_t first, std::uint64_t count, std::uint64_t local_blocks, std::uint64_t batch,
         std::uint64_t seed);
  [[nodiscard]] std::uint64_t batch() const { return batch_; }
  // Writes that cycle through every owned block once.
  [[nodiscard]] std::uint64_t cycle() const { return count_ / batch_; }
  void write(std::uint64_t w, std::span<std::int64_t> local, std::span<std::int64_t> remote) const;
  // (remote, local) of up to `max` owned blocks after `writes` writes, from
  // the blocks' last writes.
  [[nodiscard]] std::vector<std::pair<std::int64_t, std::int64_t>> landed(std::uint64_t writes,
                                                                          std::uint64_t max) const;

 private:
  std::uint64_t first_;
  std::uint64_t count_;  // a multiple of batch_
  std::uint64_t batch_;
  std::vector<std::int64_t> remote_perm_;
  std::vector<std::int64_t> local_perm_;
};

// What one writer's loop measured.
struct DriveResult {
  std::uint64_t bytes = 0;
  std::uint64_t failed = 0;
  std::int64_t start_ns = 0;  // CLOCK_MONOTONIC, comparable across processes
  std::int64_t end_ns = 0;
  Timing write_call;
  Timing poll_call;
  std::string error;
  [[nodiscard]] double seconds() const { return static_cast<double>(end_ns - start_ns) / 1e9; }
};

// One writer's share of a run: a peer and the writes it gets.
struct Job {
  std::string peer;
  const Spread* spread = nullptr;
  std::uint64_t writes = 0;
  std::uint64_t next = 0;
  std::uint64_t done = 0;
  std::uint64_t ok_bytes = 0;
  // (id, write) of the writes in flight: transfers complete in any order,
  // so a write waits until the one before it on the same blocks has ended.
  std::vector<std::pair<TransferId, std::uint64_t>> flight;
  [[nodiscard]] bool may_post() const {
    if (next >= writes) return false;
    for (const auto& f : flight)
      if (next - f.second >= spread->cycle()) return false;  // f's blocks again
    return true;
  }
  void ended(const std::vector<TransferId>& ids) {
    for (const TransferId id : ids) {
      for (auto& f : flight) {
        if (f.first == id) {
          f = flight.back();
          flight.pop_back();
          break;
        }
      }
    }
  }
};

// What a writer does after a round of polls that reported nothing (--poll-wait).
struct PollWait {
  std::string mode = "spin";  // spin | yield | sleep
  int sleep_us = 0;
  void idle() const;
  [[nodiscard]] std::string name() const;  // as --poll-wait spells it
};

// Posts the jobs' writes round-robin, at most `depth` in flight in all and
// never two on the same blocks at once, and polls each peer with writes in
// flight (scoped polls) until every write is reported.
DriveResult drive(Transport& transport, std::vector<Job>& jobs, int depth, std::uint64_t block_len,
                  const PollWait& wait);

// Untimed: write 0 of every job, landed, so that endpoint wire-up and first
// touches are not timed. (Write 0 comes again in the run, with the same
// bytes.) Throws when one fails or stalls.
void warm_up(Transport& transport, const std::vector<Job>& jobs);

}  // namespace kvxfer::tools
