// SPDX-License-Identifier: Apache-2.0
// The baselines `kvxfer bench` quotes its figures against, measured in the
// same run: memcpy of a case's own schedule (one thread, one per core), and
// for TCP runs iperf3 and one raw stream between the same two pools. Reads
// the pools and drives the target; writes only a memcpy destination and the
// report's baseline fields. (ucx_perftest and iperf3 themselves: perftest.h,
// iperf.h.)
#pragma once

#include <cstdint>
#include <string>

#include "bench.h"
#include "pool.h"
#include "target_process.h"
#include "workload.h"

namespace kvxfer::tools {

// One per core: the threads of the all-cores memcpy baseline.
unsigned memcpy_threads();

// GB/s of `schedule`'s copies, block local(w)[i] of src to block
// remote(w)[i] of dst, by `threads` threads started together. Thread t
// copies the blocks whose destination lies in its t-th slice of the
// `num_blocks`, so no two threads write the same bytes (a schedule may write
// a block twice). One thread: the physical limit of a shared-memory WRITE
// on this machine; all cores: what a multi-threaded copier could reach.
double memcpy_gbps(const Schedule& schedule, std::uint64_t block_len, std::uint64_t num_blocks,
                   const std::uint8_t* src, std::uint8_t* dst, unsigned threads);

// A TCP run's baselines, after its cases: iperf3 on loopback (alone and
// beside a spinning thread; only with a spawned target, the bench's
// --no-iperf3 skips it) and the raw stream from `source` into `target`'s
// pool at `host` (alone and beside a spinning thread; --no-raw-tcp skips
// it). Fills report's iperf3* and raw_tcp* fields; a baseline that fails
// says why there instead.
void run_tcp_baselines(const BenchArgs& args, TargetProcess& target, const std::string& host,
                       const Pool& source, BenchReport& report);

}  // namespace kvxfer::tools
