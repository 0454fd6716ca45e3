# SPDX-License-Identifier: Apache-2.0
"""The initiator of test_notify_kill.py (imported by spawned processes).

Writes one block per transfer into the target's pool, each remote block at
most once, with a notification naming the blocks ("<w> <local> <remote>"),
until `count` writes are done or the process is killed."""

import time

import numpy as np

BLOCK_LEN = 4096


def block_bytes(seed: int, index: int) -> np.ndarray:
    """What local block `index` of the writer with `seed` holds."""
    return np.random.default_rng((seed, index)).integers(0, 256, BLOCK_LEN, dtype=np.uint8)


def run(name: str, seed: int, remote_blocks, local_blocks: int, conn, engine_config: dict) -> None:
    try:
        import kvxfer

        pool = np.stack([block_bytes(seed, i) for i in range(local_blocks)])
        with kvxfer.Transport(
            name, memoryview(pool), backends=["UCX"], engine_config=engine_config
        ) as t:
            metadata, base_addr, num_blocks, block_len = conn.recv()
            t.add_remote_peer("target", metadata, base_addr, num_blocks, block_len)
            rng = np.random.default_rng(seed)
            inflight = set()
            for w, remote in enumerate(remote_blocks):
                while len(inflight) >= 16:
                    result = t.poll("target")
                    assert not result.failed and result.peer_fault is None, result
                    inflight.difference_update(result.done)
                local = int(rng.integers(0, local_blocks))
                note = f"{w} {local} {int(remote)}".encode()
                tid = t.write_blocks("target", [local], [int(remote)], notify=note)
                assert tid is not None, "write_blocks returned None"
                inflight.add(tid)
                if w == 64:
                    conn.send("streaming")
            deadline = time.monotonic() + 30
            while inflight:
                result = t.poll("target")
                assert not result.failed and result.peer_fault is None, result
                inflight.difference_update(result.done)
                assert time.monotonic() < deadline, "writes did not complete"
            conn.send(("ok", len(remote_blocks)))
            assert conn.recv() == "close"
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
