// SPDX-License-Identifier: Apache-2.0
// Per-call overhead of the transport, on the loopback engine (two transports
// in one process, a WRITE is a memcpy), so the figures are the core's and
// the engine interface's own cost, not a wire's. It uses the public API only
// and measures:
//
//   - write_blocks + poll of one write, for 1..4096 blocks, with indices in
//     random order (the core checks them for duplicates in a reused hash set)
//     and in increasing order (it skips that check);
//   - allocations per write and per block, counted by the global operator
//     new of this binary (the library's allocations land here too);
//   - heap bytes held per write in flight, and per registered peer as its
//     num_blocks grows.
//
// Issue 3's targets: < 1 µs per 16-block write + poll, < 30 ns per extra
// block, no allocation per block. Blocks are 64 bytes so the copy itself is
// a few ns per block.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench_pair.h"
#include "kvxfer/transport.h"

// --- counting allocator -----------------------------------------------------
// Every block carries its size in a header so live bytes can be tracked.
// The helpers stay out of line: inlined into a caller's delete, GCC would
// take the header arithmetic for an out-of-bounds access and free() for a
// new/free mismatch.

namespace {

std::atomic<std::uint64_t> g_allocs{0};
std::atomic<std::int64_t> g_live_bytes{0};

constexpr std::size_t kHeader = 16;  // keeps malloc's 16-byte alignment

[[gnu::noinline]] void* counted_alloc(std::size_t n) {
  auto* base = static_cast<unsigned char*>(std::malloc(n + kHeader));
  if (base == nullptr) return nullptr;
  *reinterpret_cast<std::size_t*>(base) = n;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_live_bytes.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
  return base + kHeader;
}

[[gnu::noinline]] void counted_free(void* p) {
  if (p == nullptr) return;
  auto* base = static_cast<unsigned char*>(p) - kHeader;
  g_live_bytes.fetch_sub(static_cast<std::int64_t>(*reinterpret_cast<std::size_t*>(base)),
                         std::memory_order_relaxed);
  std::free(base);
}

[[gnu::noinline]] void* counted_aligned_alloc(std::size_t n, std::align_val_t al) {
  const auto align = std::max<std::size_t>(static_cast<std::size_t>(al), kHeader);
  const std::size_t total = (n + align + align - 1) / align * align;
  auto* base = static_cast<unsigned char*>(std::aligned_alloc(align, total));
  if (base == nullptr) return nullptr;
  *reinterpret_cast<std::size_t*>(base + align - sizeof(std::size_t)) = n;
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  g_live_bytes.fetch_add(static_cast<std::int64_t>(n), std::memory_order_relaxed);
  return base + align;
}

[[gnu::noinline]] void counted_aligned_free(void* p, std::align_val_t al) {
  if (p == nullptr) return;
  const auto align = std::max<std::size_t>(static_cast<std::size_t>(al), kHeader);
  auto* base = static_cast<unsigned char*>(p) - align;
  g_live_bytes.fetch_sub(static_cast<std::int64_t>(
                             *reinterpret_cast<std::size_t*>(base + align - sizeof(std::size_t))),
                         std::memory_order_relaxed);
  std::free(base);
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new(std::size_t n, std::align_val_t al) {
  if (void* p = counted_aligned_alloc(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t al) { return operator new(n, al); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t al) noexcept { counted_aligned_free(p, al); }
void operator delete[](void* p, std::align_val_t al) noexcept { counted_aligned_free(p, al); }
void operator delete(void* p, std::size_t, std::align_val_t al) noexcept {
  counted_aligned_free(p, al);
}
void operator delete[](void* p, std::size_t, std::align_val_t al) noexcept {
  counted_aligned_free(p, al);
}

namespace {

using namespace kvxfer::bench;  // NOLINT(google-build-using-namespace)

// One write of state.range(0) blocks, then polls until it is reported.
void write_and_poll(benchmark::State& state, Order order,
                    kvxfer::Options options = loopback_options()) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Pair pair(kNumBlocks, std::move(options));
  constexpr std::size_t kLists = 64;
  const auto local = index_lists(kLists, n, order, 1);
  const auto remote = index_lists(kLists, n, order, 2);
  std::size_t k = 0;
  std::uint64_t polls = 0;
  auto one = [&] {
    const auto id = pair.initiator.write_blocks(kPeer, local[k], remote[k]);
    if (!id) {
      state.SkipWithError("write_blocks failed");
      return false;
    }
    for (;;) {
      const kvxfer::PollResult r = pair.initiator.poll(kPeer);
      ++polls;
      if (!r.done.empty()) break;
      if (!r.failed.empty() || r.peer_fault) {
        state.SkipWithError("transfer failed");
        return false;
      }
    }
    k = (k + 1) % kLists;
    return true;
  };
  for (std::size_t i = 0; i < 2 * kLists; ++i) {
    if (!one()) return;  // warm: scratch buffers and slots at their size
  }
  polls = 0;
  const std::uint64_t allocs0 = g_allocs.load();
  for (auto _ : state) {
    if (!one()) return;
  }
  const auto allocs = static_cast<double>(g_allocs.load() - allocs0);
  const auto iters = static_cast<double>(state.iterations());
  state.counters["blocks"] = static_cast<double>(n);
  state.counters["ns/block"] = benchmark::Counter(
      static_cast<double>(n) * iters, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["allocs/write"] = allocs / iters;
  state.counters["allocs/block"] = allocs / iters / static_cast<double>(n);
  state.counters["polls/write"] = static_cast<double>(polls) / iters;
}

void BM_WritePoll_Random(benchmark::State& state) { write_and_poll(state, Order::kRandom); }
void BM_WritePoll_Sorted(benchmark::State& state) { write_and_poll(state, Order::kSorted); }
// The reference `runs` case's shape: runs of 64 blocks, in random order.
void BM_WritePoll_Runs(benchmark::State& state) { write_and_poll(state, Order::kRuns); }
BENCHMARK(BM_WritePoll_Random)->Arg(1)->Arg(16)->Arg(256)->Arg(4096);
BENCHMARK(BM_WritePoll_Sorted)->Arg(1)->Arg(16)->Arg(256)->Arg(4096);
BENCHMARK(BM_WritePoll_Runs)->Arg(256)->Arg(4096);

// The same with telemetry on (Options::telemetry), its ring full: every
// transfer's record replaces the oldest, the worst case of a caller that
// never reads it.
void BM_WritePoll_Telemetry(benchmark::State& state) {
  kvxfer::Options options = loopback_options();
  options.telemetry = true;
  write_and_poll(state, Order::kRandom, options);
}
BENCHMARK(BM_WritePoll_Telemetry)->Arg(16);

// Diagnostic: no call or transfer timed (counters only).
void BM_WritePoll_Untimed(benchmark::State& state) {
  kvxfer::Options options = loopback_options();
  options.latency_sample_every = 1 << 30;
  write_and_poll(state, Order::kRandom, options);
}
BENCHMARK(BM_WritePoll_Untimed)->Arg(16);
// Diagnostic: every call and transfer timed.
void BM_WritePoll_AllTimed(benchmark::State& state) {
  kvxfer::Options options = loopback_options();
  options.latency_sample_every = 1;
  write_and_poll(state, Order::kRandom, options);
}
BENCHMARK(BM_WritePoll_AllTimed)->Arg(16);

// The int32 overload: the core widens the indices into a reused buffer.
void BM_WritePoll_Int32(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  Pair pair;
  constexpr std::size_t kLists = 64;
  std::vector<std::vector<std::int32_t>> local;
  std::vector<std::vector<std::int32_t>> remote;
  for (const auto& l : index_lists(kLists, n, Order::kRandom, 1))
    local.emplace_back(l.begin(), l.end());
  for (const auto& r : index_lists(kLists, n, Order::kRandom, 2))
    remote.emplace_back(r.begin(), r.end());
  std::size_t k = 0;
  auto one = [&] {
    const auto id = pair.initiator.write_blocks(kPeer, std::span<const std::int32_t>(local[k]),
                                                std::span<const std::int32_t>(remote[k]));
    benchmark::DoNotOptimize(id);
    while (pair.initiator.poll(kPeer).done.empty()) {
    }
    k = (k + 1) % kLists;
  };
  for (std::size_t i = 0; i < 2 * kLists; ++i) one();
  const std::uint64_t allocs0 = g_allocs.load();
  for (auto _ : state) one();
  state.counters["allocs/write"] =
      static_cast<double>(g_allocs.load() - allocs0) / static_cast<double>(state.iterations());
}
BENCHMARK(BM_WritePoll_Int32)->Arg(16)->Arg(4096);

// The caller's share of a UCX write over TCP (the reference workloads' TCP
// lane): write_blocks alone is timed, on a real pair in this process over
// the loopback interface; the wait for writes to land is not. This is where
// a post copies and checks the lists, copies its runs into a pooled
// transfer and queues it for the lane's driver thread, and wakes that
// thread when it sleeps.
struct PostCase {
  Order order = Order::kRandom;
  int depth = 1;      // writes kept in flight: 1 waits for each to land
  bool cold = false;  // this core's caches emptied before each call
  // KVXFER_LANES of both sides: the UCX lane's puts over UCX's tcp transport
  // (KVXFER_RMA=on: no RDMA device needed), or kvxfer's own tcp lane
  // (BM_TcpLanePost_*).
  const char* lane = "ucx";
  // GiB of a region the initiator registers before the timed calls, never
  // written, with KVXFER_PRETOUCH=on: its pre-touch reads it meanwhile (a
  // few seconds a GiB where the first touch is slow), on the other core.
  std::uint64_t touching_gib = 0;
};

void ucx_tcp_post(benchmark::State& state, PostCase c) {
  const auto n = static_cast<std::size_t>(state.range(0));
  kvxfer::Options options;
  options.backends = {"UCX"};
  options.engine_config = {{"TLS", "tcp"}, {"KVXFER_LANES", c.lane}};
  const bool ucx = std::string_view(c.lane) == "ucx";
  if (ucx) options.engine_config["KVXFER_RMA"] = "on";
  if (c.touching_gib > 0) options.engine_config["KVXFER_PRETOUCH"] = "on";
  Mapping touched(std::max<std::uint64_t>(c.touching_gib << 30, 1));
  Mapping initiator_pool(kNumBlocks * kBlockLen);
  Mapping target_pool(kNumBlocks * kBlockLen);
  kvxfer::Transport target("bench-target", {target_pool.data(), kNumBlocks, kBlockLen}, options);
  kvxfer::Transport initiator("bench-initiator", {initiator_pool.data(), kNumBlocks, kBlockLen},
                              options);
  initiator.add_remote_peer(kPeer, target.agent_metadata(), target.base_addr(), target.num_blocks(),
                            target.block_len());
  if (c.touching_gib > 0) {
    static_cast<void>(initiator.register_memory(touched.data(), c.touching_gib << 30));
  }
  constexpr std::size_t kLists = 64;
  const auto local = index_lists(kLists, n, c.order, 1);
  const auto remote = index_lists(kLists, n, c.order, 2);
  std::size_t k = 0;
  std::size_t inflight = 0;
  // What the other threads of a busy 2-core host do to this core's caches
  // between two calls: stream through more bytes than the caches hold.
  std::vector<std::uint8_t> evictor(c.cold ? 64u << 20 : 0u);
  // One write: the call timed; then, with `depth` in flight, polled until
  // one of them is reported.
  auto one = [&](double* seconds) {
    for (std::size_t i = 0; i < evictor.size(); i += 64) {
      evictor[i] = static_cast<std::uint8_t>(i + k);
    }
    benchmark::ClobberMemory();
    const auto t0 = std::chrono::steady_clock::now();
    const auto id = initiator.write_blocks(kPeer, local[k], remote[k]);
    const auto t1 = std::chrono::steady_clock::now();
    if (seconds != nullptr) *seconds = std::chrono::duration<double>(t1 - t0).count();
    if (!id) {
      state.SkipWithError("write_blocks failed");
      return false;
    }
    k = (k + 1) % kLists;
    for (++inflight; inflight == static_cast<std::size_t>(c.depth);) {
      const kvxfer::PollResult r = initiator.poll(kPeer);
      inflight -= r.done.size();
      if (!r.failed.empty() || r.peer_fault) {
        state.SkipWithError("transfer failed");
        return false;
      }
    }
    return true;
  };
  for (std::size_t i = 0; i < 2 * kLists; ++i) {
    if (!one(nullptr)) return;
  }
  const auto wakes = [&] { return initiator.metrics().engine_counters["ucx_progress_wakes"]; };
  const std::uint64_t allocs0 = g_allocs.load();
  const std::uint64_t wakes0 = wakes();
  for (auto _ : state) {
    double seconds = 0;
    if (!one(&seconds)) return;
    state.SetIterationTime(seconds);
  }
  const auto iters = static_cast<double>(state.iterations());
  state.counters["blocks"] = static_cast<double>(n);
  state.counters["ns/block"] = benchmark::Counter(
      static_cast<double>(n) * iters, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["allocs/write"] = static_cast<double>(g_allocs.load() - allocs0) / iters;
  if (ucx) state.counters["wakes/write"] = static_cast<double>(wakes() - wakes0) / iters;
  if (c.touching_gib > 0) {
    // 1 when the pre-touch still ran at the last call: every call met it.
    state.counters["touching"] =
        static_cast<double>(initiator.metrics().engine_counters["pretouch_running"]);
  }
  while (inflight > 0) inflight -= initiator.poll(kPeer).done.size();
}

void BM_UcxTcpPost_Random(benchmark::State& state) { ucx_tcp_post(state, {}); }
void BM_UcxTcpPost_Runs(benchmark::State& state) { ucx_tcp_post(state, {.order = Order::kRuns}); }
// Two writes in flight, as a streaming caller keeps them.
void BM_UcxTcpPost_Depth2(benchmark::State& state) { ucx_tcp_post(state, {.depth = 2}); }
// Caches emptied before each call, as a busy 2-core host does between a
// scheduler's calls: the figure the p99 of `kvxfer bench` over TCP sees.
void BM_UcxTcpPost_RandomCold(benchmark::State& state) {
  ucx_tcp_post(state, {.depth = 2, .cold = true});
}
void BM_UcxTcpPost_RunsCold(benchmark::State& state) {
  ucx_tcp_post(state, {.order = Order::kRuns, .depth = 2, .cold = true});
}
BENCHMARK(BM_UcxTcpPost_Random)->Arg(16)->Arg(1024)->Arg(4096)->UseManualTime()->Iterations(2000);
BENCHMARK(BM_UcxTcpPost_Runs)->Arg(4096)->UseManualTime()->Iterations(2000);
BENCHMARK(BM_UcxTcpPost_Depth2)->Arg(1024)->UseManualTime()->Iterations(2000);
BENCHMARK(BM_UcxTcpPost_RandomCold)->Arg(1024)->Arg(4096)->UseManualTime()->Iterations(300);
BENCHMARK(BM_UcxTcpPost_RunsCold)->Arg(4096)->UseManualTime()->Iterations(300);

// The same calls on the tcp lane (the lane of remote peers without RDMA):
// a post builds its frames' headers and runs and queues them for the I/O
// thread, which it wakes only when the peer's connection is idle.
void BM_TcpLanePost_Random(benchmark::State& state) { ucx_tcp_post(state, {.lane = "tcp"}); }
void BM_TcpLanePost_Runs(benchmark::State& state) {
  ucx_tcp_post(state, {.order = Order::kRuns, .lane = "tcp"});
}
void BM_TcpLanePost_Depth2(benchmark::State& state) {
  ucx_tcp_post(state, {.depth = 2, .lane = "tcp"});
}
void BM_TcpLanePost_RunsCold(benchmark::State& state) {
  ucx_tcp_post(state, {.order = Order::kRuns, .depth = 2, .cold = true, .lane = "tcp"});
}
BENCHMARK(BM_TcpLanePost_Random)->Arg(16)->Arg(1024)->Arg(4096)->UseManualTime()->Iterations(2000);
// The same calls while the pre-touch reads a 16 GiB region on the other
// core (docs/configuration.md, KVXFER_PRETOUCH): what a transport's calls
// cost in the seconds after it registers memory, against the row above.
void BM_TcpLanePost_DuringPretouch(benchmark::State& state) {
  ucx_tcp_post(state, {.lane = "tcp", .touching_gib = 16});
}
BENCHMARK(BM_TcpLanePost_DuringPretouch)->Arg(16)->Arg(1024)->UseManualTime()->Iterations(2000);
BENCHMARK(BM_TcpLanePost_Runs)->Arg(4096)->UseManualTime()->Iterations(2000);
BENCHMARK(BM_TcpLanePost_Depth2)->Arg(1024)->UseManualTime()->Iterations(2000);
BENCHMARK(BM_TcpLanePost_RunsCold)->Arg(4096)->UseManualTime()->Iterations(300);

// Heap bytes held per write in flight: `depth` writes posted, none polled,
// the first time (no slot or buffer to reuse yet) and once warm.
void BM_InflightBytes(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kDepth = 256;
  double cold = 0;
  double warm = 0;
  for (auto _ : state) {
    state.PauseTiming();
    Pair pair;
    const auto local = index_lists(kDepth, n, Order::kRandom, 1);
    const auto remote = index_lists(kDepth, n, Order::kRandom, 2);
    state.ResumeTiming();
    for (int round = 0; round < 2; ++round) {
      const std::int64_t live0 = g_live_bytes.load();
      std::size_t posted = 0;
      for (std::size_t w = 0; w < kDepth; ++w) {
        // Distinct remote lists per write, so no two writes in flight race.
        if (pair.initiator.write_blocks(kPeer, local[w], remote[w])) ++posted;
      }
      const double per_write =
          static_cast<double>(g_live_bytes.load() - live0) / static_cast<double>(posted);
      (round == 0 ? cold : warm) = per_write;
      std::size_t done = 0;
      while (done < posted) done += pair.initiator.poll(kPeer).done.size();
    }
  }
  state.counters["bytes/inflight_write_cold"] = cold;
  state.counters["bytes/inflight_write_warm"] = warm;
}
BENCHMARK(BM_InflightBytes)->Arg(1)->Arg(16)->Iterations(3);

// Heap bytes a registered peer holds, as its num_blocks grows: O(1).
void BM_PeerBytes(benchmark::State& state) {
  const auto blocks = static_cast<std::uint64_t>(state.range(0));
  double held = 0;
  for (auto _ : state) {
    Pair pair(blocks);
    pair.initiator.remove_remote_peer(kPeer);
    const std::int64_t live0 = g_live_bytes.load();
    pair.add_peer();
    held = static_cast<double>(g_live_bytes.load() - live0);
  }
  state.counters["peer_blocks"] = static_cast<double>(blocks);
  state.counters["bytes/peer"] = held;
}
BENCHMARK(BM_PeerBytes)->Arg(1 << 10)->Arg(1 << 18)->Arg(1 << 24)->Iterations(3);

// Records real time per benchmark (the median over --benchmark_repetitions)
// so the per-extra-block cost can be derived from the 16- and 4096-block runs.
class Recorder : public benchmark::ConsoleReporter {
 public:
  Recorder() : ConsoleReporter(::isatty(STDOUT_FILENO) != 0 ? OO_ColorTabular : OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      // ns, the default unit. With --benchmark_report_aggregates_only only
      // the aggregates come here; their median stands for the runs.
      if (run.run_type == Run::RT_Iteration) {
        ns_[run.run_name.str()].push_back(run.GetAdjustedRealTime());
      } else if (run.aggregate_name == "median") {
        medians_[run.run_name.str()] = run.GetAdjustedRealTime();
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  void print_derived() {
    for (const char* order : {"Random", "Sorted"}) {
      const double a = median(std::string("BM_WritePoll_") + order + "/16");
      const double b = median(std::string("BM_WritePoll_") + order + "/4096");
      if (a < 0 || b < 0) continue;
      std::printf(
          "write_blocks + poll, %s indices: %.0f ns per 16-block write, %.1f ns per "
          "additional block (16 -> 4096)\n",
          order, a, (b - a) / (4096 - 16));
    }
  }

 private:
  double median(const std::string& name) {
    if (const auto m = medians_.find(name); m != medians_.end()) return m->second;
    auto it = ns_.find(name);
    if (it == ns_.end() || it->second.empty()) return -1;
    auto& v = it->second;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
  std::map<std::string, std::vector<double>> ns_;
  std::map<std::string, double> medians_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Recorder recorder;
  benchmark::RunSpecifiedBenchmarks(&recorder);
  recorder.print_derived();
  benchmark::Shutdown();
  return 0;
}
