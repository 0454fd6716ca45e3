// SPDX-License-Identifier: Apache-2.0
// What the loopback micro-benchmarks share (transport_bench.cc,
// descs_bench.cc): untouched pools, an initiator and a target registered
// with each other, and index lists in the reference workloads' orders.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "kvxfer/transport.h"

namespace kvxfer::bench {

constexpr std::uint64_t kBlockLen = 64;
constexpr std::uint64_t kNumBlocks = 1 << 16;
constexpr const char* kPeer = "target";

// Address space without touching it: the loopback engine only copies the
// bytes a transfer names.
class Mapping {
 public:
  explicit Mapping(std::size_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<std::uint8_t*>(p);
  }
  ~Mapping() { ::munmap(data_, bytes_); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  [[nodiscard]] std::uint8_t* data() const { return data_; }

 private:
  std::size_t bytes_;
  std::uint8_t* data_ = nullptr;
};

kvxfer::Options loopback_options() {
  kvxfer::Options options;
  options.backends = {"LOOPBACK"};
  return options;
}

// An initiator and a target, both loopback, the target registered as a peer.
struct Pair {
  explicit Pair(std::uint64_t target_blocks = kNumBlocks,
                kvxfer::Options initiator_options = loopback_options())
      : initiator_pool(kNumBlocks * kBlockLen),
        target_pool(target_blocks * kBlockLen),
        initiator("bench-initiator", {initiator_pool.data(), kNumBlocks, kBlockLen},
                  std::move(initiator_options)),
        target("bench-target", {target_pool.data(), target_blocks, kBlockLen}, loopback_options()) {
    add_peer();
  }
  void add_peer() {
    const auto meta = target.agent_metadata();
    initiator.add_remote_peer(kPeer, meta, target.base_addr(), target.num_blocks(),
                              target.block_len());
  }
  Mapping initiator_pool;
  Mapping target_pool;
  kvxfer::Transport initiator;
  kvxfer::Transport target;
};

enum class Order { kRandom, kSorted, kRuns };
constexpr std::size_t kRunLen = 64;  // the reference workload's runs:64

// `count` index lists of n blocks each: random samples without repetition,
// the same sorted, or runs of kRunLen consecutive blocks at random,
// non-overlapping places, in random order (n a multiple of kRunLen).
std::vector<std::vector<std::int64_t>> index_lists(std::size_t count, std::size_t n, Order order,
                                                   std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::size_t units = order == Order::kRuns ? kNumBlocks / kRunLen : kNumBlocks;
  const std::size_t picks = order == Order::kRuns ? n / kRunLen : n;
  std::vector<std::int64_t> perm(units);
  std::iota(perm.begin(), perm.end(), 0);
  std::vector<std::vector<std::int64_t>> lists(count);
  for (auto& list : lists) {
    for (std::size_t i = 0; i < picks; ++i) {
      std::swap(perm[i], perm[i + rng() % (units - i)]);
    }
    list.clear();
    for (std::size_t i = 0; i < picks; ++i) {
      if (order != Order::kRuns) {
        list.push_back(perm[i]);
        continue;
      }
      for (std::size_t j = 0; j < kRunLen; ++j) {
        list.push_back(perm[i] * static_cast<std::int64_t>(kRunLen) + static_cast<std::int64_t>(j));
      }
    }
    if (order == Order::kSorted) std::sort(list.begin(), list.end());
  }
  return lists;
}

}  // namespace kvxfer::bench
