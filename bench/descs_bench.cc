// SPDX-License-Identifier: Apache-2.0
// The descriptor path (the one NIXL's agent API takes) against write_blocks
// for the same blocks, and prepare() of a vLLM-shaped list (regions x
// blocks). On the LOOPBACK engine a transfer is a memcpy, so the difference
// between the two write benchmarks is what the descriptor path adds to a
// call. Run: build/bench/kvxfer_descs_bench [--benchmark_filter=...].
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_pair.h"
#include "kvxfer/transport.h"

namespace {

using namespace kvxfer::bench;  // NOLINT(google-build-using-namespace)

// Posts one transfer per iteration with `post(k)` and polls until it is
// reported.
template <typename PostFn>
void post_and_poll(benchmark::State& state, kvxfer::Transport& t, std::size_t lists, PostFn post) {
  std::size_t k = 0;
  const auto one = [&] {
    const auto id = post(k);
    if (!id) {
      state.SkipWithError("the post failed");
      return false;
    }
    for (;;) {
      const kvxfer::PollResult r = t.poll(kPeer);
      if (!r.done.empty()) break;
      if (!r.failed.empty() || r.peer_fault) {
        state.SkipWithError("the transfer failed");
        return false;
      }
    }
    k = (k + 1) % lists;
    return true;
  };
  for (std::size_t i = 0; i < 2 * lists; ++i) {
    if (!one()) return;  // warm
  }
  for (auto _ : state) {
    if (!one()) return;
  }
  state.counters["blocks"] = static_cast<double>(state.range(0));
}

constexpr std::size_t kLists = 64;

void BM_Blocks_WritePoll(benchmark::State& state) {
  Pair pair;
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto local = index_lists(kLists, n, Order::kRandom, 1);
  const auto remote = index_lists(kLists, n, Order::kRandom, 2);
  post_and_poll(state, pair.initiator, kLists, [&](std::size_t k) {
    return pair.initiator.write_blocks(kPeer, local[k], remote[k]);
  });
}
BENCHMARK(BM_Blocks_WritePoll)->Arg(1)->Arg(16)->Arg(256)->Arg(4096);

// The same blocks as descriptors: every block of each pool in one list,
// prepared once (one strided run each), transfers by index.
void BM_Descs_WritePoll(benchmark::State& state) {
  Pair pair;
  const auto n = static_cast<std::size_t>(state.range(0));
  const auto local = index_lists(kLists, n, Order::kRandom, 1);
  const auto remote = index_lists(kLists, n, Order::kRandom, 2);
  std::vector<kvxfer::MemDesc> ours(kNumBlocks);
  std::vector<kvxfer::MemDesc> theirs(kNumBlocks);
  for (std::uint64_t b = 0; b < kNumBlocks; ++b) {
    ours[b] = {pair.initiator.base_addr() + b * kBlockLen, kBlockLen};
    theirs[b] = {pair.target.base_addr() + b * kBlockLen, kBlockLen};
  }
  const kvxfer::DescList l = pair.initiator.prepare(ours);
  const kvxfer::DescList r = pair.initiator.prepare(theirs, kPeer);
  post_and_poll(state, pair.initiator, kLists, [&](std::size_t k) {
    return pair.initiator.transfer(kvxfer::TransferOp::kWrite, kPeer, l, local[k], r, remote[k]);
  });
  state.counters["runs"] = static_cast<double>(l.runs() + r.runs());
}
BENCHMARK(BM_Descs_WritePoll)->Arg(1)->Arg(16)->Arg(256)->Arg(4096);

// vLLM's list: one descriptor per block of every region (K and V of each
// layer), prepared against a peer's metadata: state.range(0) regions of
// state.range(1) blocks.
void BM_Prepare_RegionsXBlocks(benchmark::State& state) {
  const auto regions = static_cast<std::uint64_t>(state.range(0));
  const auto blocks = static_cast<std::uint64_t>(state.range(1));
  const std::uint64_t region_len = blocks * kBlockLen;
  Mapping memory(regions * region_len);
  kvxfer::Transport target(kPeer, kvxfer::Region{}, loopback_options());
  for (std::uint64_t g = 0; g < regions; ++g) {
    static_cast<void>(target.register_memory(memory.data() + g * region_len, region_len));
  }
  kvxfer::Transport initiator("initiator", kvxfer::Region{}, loopback_options());
  initiator.add_remote_peer(kPeer, target.agent_metadata());
  std::vector<kvxfer::MemDesc> descs;
  descs.reserve(regions * blocks);
  const auto base = reinterpret_cast<std::uintptr_t>(memory.data());
  for (std::uint64_t g = 0; g < regions; ++g) {
    for (std::uint64_t b = 0; b < blocks; ++b) descs.push_back({base + g * region_len + b * kBlockLen, kBlockLen});
  }
  std::size_t runs = 0;
  for (auto _ : state) {
    const kvxfer::DescList list = initiator.prepare(descs, kPeer);
    runs = list.runs();
    benchmark::DoNotOptimize(runs);
  }
  state.counters["descriptors"] = static_cast<double>(descs.size());
  state.counters["runs"] = static_cast<double>(runs);
  state.counters["ns/descriptor"] =
      benchmark::Counter(static_cast<double>(descs.size()) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Prepare_RegionsXBlocks)->Args({64, 16384})->Args({64, 1024})->Args({8, 16384})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
