# SPDX-License-Identifier: Apache-2.0
"""One side of the two-process UCX test (imported by spawned processes)."""

import time

import numpy as np

NUM_BLOCKS = 64
BLOCK_LEN = 4096
HALF = NUM_BLOCKS // 2


def source_blocks(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(HALF, BLOCK_LEN), dtype=np.uint8)


def destinations(seed: int) -> np.ndarray:
    """Where the agent with `seed` writes its source block i: the peer's upper half."""
    return HALF + np.random.default_rng(seed + 1000).permutation(HALF)


def run(name: str, seed: int, peer_seed: int, conn, engine_config: dict, shared: bool = False) -> None:
    """Writes its source blocks into the peer's upper half, then checks what
    the peer wrote into its own, then reads the peer's source blocks back
    into its upper half. Reports ("ok", detail) or ("error", detail).
    With `shared`, both pools are kvxfer.shared_pool arrays, which a peer on
    this host maps (its stats then count one mapped peer)."""
    try:
        import kvxfer

        if shared:
            pool = kvxfer.shared_pool(NUM_BLOCKS, BLOCK_LEN)
        else:
            pool = np.zeros((NUM_BLOCKS, BLOCK_LEN), np.uint8)
        pool[:HALF] = source_blocks(seed)
        with kvxfer.Transport(
            name, memoryview(pool), backends=["UCX"], engine_config=engine_config
        ) as t:
            conn.send((t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len))
            metadata, base_addr, num_blocks, block_len = conn.recv()
            t.add_remote_peer("peer", metadata, base_addr, num_blocks, block_len)
            mapped = t.stats()["engine_counters"].get("cma_mapped_peers", 0)
            # The same-host lane (which maps shared pools) serves the peer
            # unless KVXFER_LANES puts another lane first.
            lanes = engine_config.get("KVXFER_LANES", "cma,ucx,tcp").split(",")
            if shared and lanes[0] == "cma":
                assert mapped == 1, f"the peer's shared pool was not mapped ({mapped})"
            elif not shared:
                assert mapped == 0, f"a private pool was mapped ({mapped})"

            dest = destinations(seed)
            # Two writes: an int64 array and an int32 one, both read in place.
            ids = {
                t.write_blocks("peer", np.arange(0, 16, dtype=np.int64), dest[:16].astype(np.int64)),
                t.write_blocks("peer", np.arange(16, HALF, dtype=np.int32), dest[16:].astype(np.int32)),
            }
            assert None not in ids, "write_blocks returned None"
            deadline = time.monotonic() + 30
            done = set()
            while done != ids:
                result = t.poll("peer")
                assert not result.failed and result.peer_fault is None, result
                done.update(result.done)
                assert time.monotonic() < deadline, "writes did not complete"

            conn.send("written")
            assert conn.recv() == "verify"
            expected = source_blocks(peer_seed)
            got = pool[destinations(peer_seed)]
            bad = [i for i in range(HALF) if not np.array_equal(got[i], expected[i])]
            conn.send(("ok" if not bad else "error", f"{len(bad)} wrong blocks"))

            # READ back: the peer's source blocks (its lower half, which no
            # one writes) into our upper half, in a shuffled order.
            assert conn.recv() == "read"
            into = destinations(seed + 7)
            tid = t.read_blocks("peer", into.astype(np.int32), np.arange(HALF, dtype=np.int64))
            assert tid is not None, "read_blocks returned None"
            deadline = time.monotonic() + 30
            while True:
                result = t.poll("peer")
                assert not result.failed and result.peer_fault is None, result
                if tid in result.done:
                    break
                assert time.monotonic() < deadline, "the read did not complete"
            bad = [i for i in range(HALF) if not np.array_equal(pool[into[i]], expected[i])]
            conn.send(("ok" if not bad else "error", f"{len(bad)} wrong blocks read"))
            assert conn.recv() == "close"
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
