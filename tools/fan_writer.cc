// SPDX-License-Identifier: Apache-2.0
#include "fan_writer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <stdexcept>

#include "bench.h"
#include "pattern.h"

namespace kvxfer::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kStallTimeout = std::chrono::seconds(60);

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::vector<std::int64_t> shuffled(std::uint64_t first, std::uint64_t count, std::uint64_t seed) {
  std::vector<std::int64_t> v(count);
  std::iota(v.begin(), v.end(), static_cast<std::int64_t>(first));
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

}  // namespace

void PollWait::idle() const { poll_idle(mode, sleep_us); }

std::string PollWait::name() const {
  return mode == "sleep" ? fmt::format("sleep:{}", sleep_us) : mode;
}

Spread::Spread(std::uint64_t first, std::uint64_t count, std::uint64_t local_blocks,
               std::uint64_t batch, std::uint64_t seed)
    : first_(first), count_(count / batch * batch), batch_(batch) {
  if (batch == 0 || count_ == 0 || local_blocks == 0) {
    throw std::invalid_argument("a writer needs at least one batch of blocks");
  }
  remote_perm_ = shuffled(first_, count_, seed);
  local_perm_ = shuffled(0, local_blocks, mix64(seed));
}

void Spread::write(std::uint64_t w, std::span<std::int64_t> local,
                   std::span<std::int64_t> remote) const {
  const std::uint64_t at = (w % cycle()) * batch_;
  const std::uint64_t l = local_perm_.size();
  for (std::uint64_t j = 0; j < batch_; ++j) {
    remote[j] = remote_perm_[at + j];
    local[j] = local_perm_[(w * batch_ + j) % l];
  }
}

std::vector<std::pair<std::int64_t, std::int64_t>> Spread::landed(std::uint64_t writes,
                                                                  std::uint64_t max) const {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const std::uint64_t c = cycle();
  const std::uint64_t l = local_perm_.size();
  // The last write of each batch slot k is the largest w < writes with w % c == k.
  for (std::uint64_t k = 0; k < c && k < writes && out.size() < max; ++k) {
    const std::uint64_t last = k + (writes - 1 - k) / c * c;
    for (std::uint64_t j = 0; j < batch_ && out.size() < max; ++j) {
      out.emplace_back(remote_perm_[k * batch_ + j], local_perm_[(last * batch_ + j) % l]);
    }
  }
  return out;
}

DriveResult drive(Transport& transport, std::vector<Job>& jobs, int depth, std::uint64_t block_len,
                  const PollWait& wait) {
  DriveResult out;
  const std::uint64_t batch = jobs.front().spread->batch();
  std::vector<std::int64_t> local(batch);
  std::vector<std::int64_t> remote(batch);
  LatencyHistogram write_us;
  LatencyHistogram poll_us;
  std::uint64_t total = 0;
  for (Job& j : jobs) {
    total += j.writes;
    j.flight.reserve(static_cast<std::size_t>(depth));
  }
  std::uint64_t done = 0;
  int inflight = 0;
  std::size_t rr = 0;
  out.start_ns = now_ns();
  auto last_completion = Clock::now();
  while (done < total && out.error.empty()) {
    for (std::size_t idle = 0; inflight < depth && idle < jobs.size();) {
      Job& j = jobs[rr];
      rr = (rr + 1) % jobs.size();
      if (!j.may_post()) {
        ++idle;
        continue;
      }
      idle = 0;
      j.spread->write(j.next, local, remote);
      const auto t0 = Clock::now();
      const auto id = transport.write_blocks(j.peer, std::span<const std::int64_t>(local),
                                             std::span<const std::int64_t>(remote));
      write_us.add(micros(Clock::now() - t0));
      if (!id) {
        out.error = fmt::format("write_blocks to {} failed to post", j.peer);
        break;
      }
      j.flight.emplace_back(*id, j.next);
      ++j.next;
      ++inflight;
    }
    bool any = false;
    for (Job& j : jobs) {
      if (j.flight.empty()) continue;
      const auto p0 = Clock::now();
      const PollResult r = transport.poll(j.peer);
      poll_us.add(micros(Clock::now() - p0));
      j.ended(r.done);
      j.ended(r.failed);
      const auto n = static_cast<int>(r.done.size() + r.failed.size());
      inflight -= n;
      j.done += static_cast<std::uint64_t>(n);
      j.ok_bytes += r.done.size() * batch * block_len;
      done += static_cast<std::uint64_t>(n);
      out.failed += r.failed.size();
      any = any || n > 0;
      if (r.peer_fault) out.error = fmt::format("peer {} faulted: {}", j.peer, *r.peer_fault);
    }
    if (any) {
      last_completion = Clock::now();
      continue;
    }
    if (Clock::now() - last_completion > kStallTimeout) {
      out.error = fmt::format("stalled: no write completed for {} s", kStallTimeout.count());
    }
    wait.idle();
  }
  out.end_ns = now_ns();
  for (const Job& j : jobs) out.bytes += j.ok_bytes;
  out.write_call = write_us.timing();
  out.poll_call = poll_us.timing();
  return out;
}

void warm_up(Transport& transport, const std::vector<Job>& jobs) {
  const std::uint64_t batch = jobs.front().spread->batch();
  std::vector<std::int64_t> local(batch);
  std::vector<std::int64_t> remote(batch);
  for (const Job& j : jobs) {
    j.spread->write(0, local, remote);
    const auto id = transport.write_blocks(j.peer, std::span<const std::int64_t>(local),
                                           std::span<const std::int64_t>(remote));
    if (!id) throw std::runtime_error("warm-up write_blocks to " + j.peer + " failed to post");
    const auto deadline = Clock::now() + kStallTimeout;
    for (;;) {
      const PollResult r = transport.poll(j.peer);
      if (!r.failed.empty() || r.peer_fault)
        throw std::runtime_error("warm-up write to " + j.peer + " failed");
      if (!r.done.empty()) break;
      if (Clock::now() > deadline)
        throw std::runtime_error("warm-up write to " + j.peer + " stalled");
    }
  }
}

}  // namespace kvxfer::tools
