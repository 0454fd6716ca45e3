#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Cost of driving kvxfer from Python: write_blocks + poll pairs.

Times the same loop two ways on the LOOPBACK engine (a WRITE is a memcpy into
a peer in this process, so the figure is call cost plus the copy):

  python  for each pair: t.write_blocks(peer, local, remote); t.poll(peer)
          with `local`/`remote` numpy int64 arrays of --indices entries
  c++     the same Transport calls in a C++ loop (_kvxfer_bench.time_write_poll,
          an extension built beside the package when KVXFER_BUILD_BENCH is on),
          on the same transports and indices

Each figure is the median, over --repeats batches, of the mean time per pair
in a batch of --pairs pairs. Every write completes at its poll.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py
"""

import argparse
import os
import statistics
import sys
import time


def import_kvxfer(build_dir):
    if build_dir:
        sys.path.insert(0, os.path.join(build_dir, "python"))
    try:
        import kvxfer  # noqa: F401
    except ImportError:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        for candidate in ("build", "build-py"):
            sys.path.insert(0, os.path.join(root, candidate, "python"))
    import kvxfer

    return kvxfer


def time_python(transport, peer, local, remote, pairs, repeats):
    write, poll = transport.write_blocks, transport.poll
    per_pair = []
    for _ in range(repeats):
        before = transport.stats()["peers"][peer]["transfers_done"]
        start = time.perf_counter_ns()
        for _ in range(pairs):
            write(peer, local, remote)
            poll(peer)
        per_pair.append((time.perf_counter_ns() - start) / pairs)
        stats = transport.stats()
        assert stats["peers"][peer]["transfers_done"] - before == pairs and stats["inflight"] == 0
    return per_pair


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-len", type=int, nargs="+", default=[64, 1024, 4096, 16384])
    parser.add_argument("--indices", type=int, default=16, help="blocks per write_blocks")
    parser.add_argument("--num-blocks", type=int, default=1024)
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per batch")
    parser.add_argument("--repeats", type=int, default=31, help="batches")
    parser.add_argument("--build-dir", help="build tree holding python/kvxfer")
    args = parser.parse_args()

    kvxfer = import_kvxfer(args.build_dir)
    import numpy as np
    # The same Transport objects, driven from C++ (python_overhead_loop.cc).
    try:
        from _kvxfer_bench import time_write_poll
    except ImportError:
        sys.exit("_kvxfer_bench not found beside the kvxfer package: build with KVXFER_BUILD_BENCH=ON")

    print(f"kvxfer {kvxfer.__version__}, Python {sys.version.split()[0]}, numpy {np.__version__}")
    print(
        f"LOOPBACK, {args.indices} random indices per write (numpy int64), "
        f"median of {args.repeats} batches of {args.pairs} write+poll pairs\n"
    )
    print(f"{'block_len':>9}  {'python ns/pair':>14}  {'c++ ns/pair':>11}  {'overhead ns':>11}  {'ratio':>5}")
    rng = np.random.default_rng(0)
    results = []
    for block_len in args.block_len:
        pools = [np.zeros((args.num_blocks, block_len), np.uint8) for _ in range(2)]
        with kvxfer.Transport("bench-src", memoryview(pools[0]), backends=["LOOPBACK"]) as src, \
                kvxfer.Transport("bench-dst", memoryview(pools[1]), backends=["LOOPBACK"]) as dst:
            src.add_remote_peer(
                "dst", dst.get_agent_metadata(), dst.base_addr, dst.num_blocks, dst.block_len
            )
            local = rng.choice(args.num_blocks, args.indices, replace=False).astype(np.int64)
            remote = rng.choice(args.num_blocks, args.indices, replace=False).astype(np.int64)
            # Warm up both paths (pages, caches, allocator).
            time_python(src, "dst", local, remote, args.pairs, 2)
            time_write_poll(src, "dst", local, remote, args.pairs, 2)
            # Batches alternate between the two, so drift on a shared machine
            # hits both alike.
            py_batches, cpp_batches = [], []
            for _ in range(args.repeats):
                py_batches += time_python(src, "dst", local, remote, args.pairs, 1)
                cpp_batches += time_write_poll(src, "dst", local, remote, args.pairs, 1)
            py, cpp = statistics.median(py_batches), statistics.median(cpp_batches)
        results.append((block_len, py, cpp))
        print(f"{block_len:>9}  {py:>14.0f}  {cpp:>11.0f}  {py - cpp:>11.0f}  {py / cpp:>5.2f}")

    print("\ntargets: < 5 us per pair from Python; < 2x the same pair from C++")
    for block_len, py, cpp in results:
        under_5us = "yes" if py < 5000 else ("no (the C++ pair alone is copy-bound)" if cpp >= 5000 else "no")
        under_2x = "yes" if py < 2 * cpp else "no"
        print(f"  block_len {block_len:>6}: < 5 us: {under_5us}; < 2x C++: {under_2x}")


if __name__ == "__main__":
    main()
