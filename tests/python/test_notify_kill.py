# SPDX-License-Identifier: Apache-2.0
"""An initiator SIGKILLed in the middle of a stream of writes with
notifications, over UCX (shared memory and TCP): the target delivers only
whole messages whose blocks already hold their bytes, none twice, and goes
on taking writes and notifications from the next initiator."""

import multiprocessing
import time

import numpy as np
import pytest

import kvxfer
import _notify_writer
from _notify_writer import BLOCK_LEN, block_bytes

NUM_BLOCKS = 32768  # 128 MiB: the killed writer could never finish in time
KILLED_WRITES = 30000
LATER_WRITES = 256


def collect(target, into: dict, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        for sender, messages in target.get_notifications().items():
            into.setdefault(sender, []).extend(messages)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.002)


def check_messages(target, messages, seed: int, allowed_remote) -> set:
    """Every message whole and once, naming a block that holds its bytes;
    returns the write numbers delivered."""
    seen = set()
    for message in messages:
        fields = message.decode().split(" ")
        assert len(fields) == 3, message
        w, local, remote = (int(f) for f in fields)
        assert w not in seen, f"write {w} delivered twice"
        seen.add(w)
        assert remote == allowed_remote[w], message
        assert np.array_equal(target.pool[remote], block_bytes(seed, local)), (
            f"write {w}: its notification arrived before its bytes"
        )
    return seen


def spawn_writer(ctx, name, seed, remote_blocks, target_geometry, tls):
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(
        target=_notify_writer.run,
        args=(name, seed, remote_blocks, 64, theirs, engine_config(tls)),
        daemon=True,
    )
    proc.start()
    ours.send(target_geometry)
    return proc, ours


def engine_config(tls: str) -> dict:
    """UCX_TLS speaks for the ucx lane only: "tcp" between two processes of
    this host means the tcp lane (KVXFER_LANES), or the same-host lane would
    serve them."""
    return {"TLS": tls} if "sm" in tls else {"TLS": tls, "KVXFER_LANES": "tcp"}


def expect(conn, what: str, seconds: float = 60):
    assert conn.poll(seconds), f"the writer did not say {what}"
    message = conn.recv()
    if isinstance(message, tuple) and message[0] == "error":
        pytest.fail(f"writer: {message[1]}")
    return message


@pytest.mark.parametrize("tls", ["sm,self", "tcp"])
def test_a_sigkilled_initiator_leaves_only_whole_notifications_after_their_bytes(tls):
    pool = np.zeros((NUM_BLOCKS, BLOCK_LEN), np.uint8)
    order = np.random.default_rng(5).permutation(NUM_BLOCKS)
    killed_remote = [int(r) for r in order[:KILLED_WRITES]]
    later_remote = [int(r) for r in order[KILLED_WRITES : KILLED_WRITES + LATER_WRITES]]
    ctx = multiprocessing.get_context("spawn")
    with kvxfer.Transport(
        "target", memoryview(pool), backends=["UCX"], engine_config=engine_config(tls)
    ) as target:
        target.pool = pool
        geometry = (target.get_agent_metadata(), target.base_addr, NUM_BLOCKS, BLOCK_LEN)
        notes: dict = {}

        proc, conn = spawn_writer(ctx, "writer-a", 1, killed_remote, geometry, tls)
        try:
            deadline = time.monotonic() + 60
            while not conn.poll(0):
                assert time.monotonic() < deadline, "the writer never started streaming"
                collect(target, notes, 0.01)
            assert expect(conn, "streaming") == "streaming"
            collect(target, notes, 0.05)
            proc.kill()
            proc.join(30)
            assert proc.exitcode == -9
        finally:
            if proc.is_alive():
                proc.kill()
        collect(target, notes, 1.0)
        delivered = check_messages(target, notes.pop("writer-a", []), 1, killed_remote)
        assert len(delivered) >= 64 - 16, "fewer messages than writes done before the kill"
        assert len(delivered) < KILLED_WRITES, "the writer finished before it was killed"
        assert notes == {}

        # The next initiator is served as if nothing happened.
        proc, conn = spawn_writer(ctx, "writer-b", 2, later_remote, geometry, tls)
        try:
            assert expect(conn, "streaming") == "streaming"
            assert expect(conn, "its end") == ("ok", LATER_WRITES)
            conn.send("close")
            proc.join(30)
            assert proc.exitcode == 0
        finally:
            if proc.is_alive():
                proc.kill()
        collect(target, notes, 0.2)
        delivered = check_messages(target, notes.pop("writer-b", []), 2, later_remote)
        assert delivered == set(range(LATER_WRITES))
        assert notes == {}
