# SPDX-License-Identifier: Apache-2.0
"""write_blocks must post only the indices it validated, however the caller's
numpy arrays change meanwhile: another thread flips one remote index between
a valid block and one past the target's pool while write_blocks loops over
the same-host lane. The target (another process) maps a guard region right
after its pool; it must stay untouched."""

import multiprocessing
import sys
import threading
import time

import numpy as np
import pytest

import kvxfer
import _guarded_target

ENGINE_CONFIG = {"TLS": "sm,self"}
# Many small blocks: the longer the lists, the longer write_blocks runs
# without the GIL between its first and last read of the flipped index.
NUM_BLOCKS = 4096
BLOCK_LEN = 64
GUARD_BLOCKS = 8
PER_WRITE = NUM_BLOCKS


def ucx_unavailable_reason():
    pool = np.zeros((1, 64), np.uint8)
    try:
        with kvxfer.Transport("ucx-probe", pool, backends=["UCX"], engine_config=ENGINE_CONFIG):
            return None
    except RuntimeError as exc:
        return f"kvxfer reports the UCX engine unavailable: {exc}"


@pytest.fixture
def guarded_target():
    reason = ucx_unavailable_reason()
    if reason:
        pytest.skip(reason)
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(
        target=_guarded_target.run,
        args=("guarded-target", NUM_BLOCKS, BLOCK_LEN, GUARD_BLOCKS, theirs, ENGINE_CONFIG),
        daemon=True,
    )
    proc.start()

    def recv():
        if not ours.poll(60):
            pytest.fail("the target did not answer")
        message = ours.recv()
        if isinstance(message, tuple) and message and message[0] == "error":
            pytest.fail(f"target: {message[1]}")
        return message

    def guard_changed():
        ours.send("guard")
        return recv()

    try:
        yield recv(), guard_changed
        ours.send("close")
        assert recv() == "closed"
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_remote_index_flipped_by_another_thread_never_writes_past_the_pool(
    guarded_target, dtype
):
    (metadata, base_addr, num_blocks, block_len), guard_changed = guarded_target
    pool = np.random.default_rng(7).integers(0, 256, size=(NUM_BLOCKS, BLOCK_LEN), dtype=np.uint8)
    local = np.arange(PER_WRITE, dtype=dtype)
    remote = np.arange(NUM_BLOCKS - PER_WRITE, NUM_BLOCKS, dtype=dtype)
    valid = int(remote[-1])
    stop = threading.Event()

    def flip():
        k = 0
        while not stop.is_set():
            remote[-1] = NUM_BLOCKS + k % GUARD_BLOCKS
            for _ in range(k % 97):  # hold each value a varying while
                pass
            remote[-1] = valid
            for _ in range(k * 7 % 101):
                pass
            k += 1

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often, so flips interleave
    posted = refused = not_posted = 0
    with kvxfer.Transport(
        "race-initiator", memoryview(pool), backends=["UCX"], engine_config=ENGINE_CONFIG
    ) as t:
        t.add_remote_peer("t", metadata, base_addr, num_blocks, block_len)
        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            deadline = time.monotonic() + 2.5
            while time.monotonic() < deadline:
                try:
                    tid = t.write_blocks("t", local, remote)
                except ValueError:
                    refused += 1
                else:
                    if tid is None:
                        not_posted += 1
                    else:
                        posted += 1
                t.poll("t")
        finally:
            stop.set()
            flipper.join()
            sys.setswitchinterval(old_interval)
        deadline = time.monotonic() + 30
        while t.stats()["inflight"] and time.monotonic() < deadline:
            t.poll("t")
        assert t.stats()["engine_counters"].get("cma_writes", 0) > 0, "not the same-host lane"

    assert guard_changed() == 0, f"bytes past the pool changed ({posted} posted, {refused} refused)"
    assert not_posted == 0
