# SPDX-License-Identifier: Apache-2.0
"""Two real processes write numpy-backed pools into each other over UCX, then
read each other's blocks back; and the same with kvxfer.shared_pool pools,
which same-host peers map."""

import multiprocessing
import os

import numpy as np
import pytest

import kvxfer
import _ucx_peer

ENGINE_CONFIG = {"TLS": os.environ.get("KVXFER_TEST_UCX_TLS", "sm,self")}
# UCX_TLS speaks for the ucx lane only: a TCP run between two processes of
# this host names the tcp lane, or the same-host lane would serve it.
if "sm" not in ENGINE_CONFIG["TLS"]:
    ENGINE_CONFIG["KVXFER_LANES"] = "tcp"


def ucx_unavailable_reason():
    pool = np.zeros((1, 64), np.uint8)
    try:
        with kvxfer.Transport("ucx-probe", pool, backends=["UCX"], engine_config=ENGINE_CONFIG):
            return None
    except RuntimeError as exc:
        return f"kvxfer reports the UCX engine unavailable: {exc}"


@pytest.mark.parametrize("shared", [False, True], ids=["numpy", "shared_pool"])
def test_two_processes_write_each_others_pools_over_ucx(shared):
    reason = ucx_unavailable_reason()
    if reason:
        pytest.skip(reason)
    ctx = multiprocessing.get_context("spawn")
    ends = [ctx.Pipe() for _ in range(2)]
    procs = [
        ctx.Process(
            target=_ucx_peer.run,
            args=(f"ucx-agent-{i}", 10 + i, 10 + (1 - i), ends[i][1], ENGINE_CONFIG, shared),
            daemon=True,
        )
        for i in range(2)
    ]
    for p in procs:
        p.start()
    conns = [end[0] for end in ends]
    try:

        def recv(i):
            if not conns[i].poll(60):
                pytest.fail(f"agent {i} did not answer")
            message = conns[i].recv()
            if isinstance(message, tuple) and message and message[0] == "error":
                pytest.fail(f"agent {i}: {message[1]}")
            return message

        geometry = [recv(0), recv(1)]
        conns[0].send(geometry[1])
        conns[1].send(geometry[0])
        assert [recv(0), recv(1)] == ["written", "written"]
        for c in conns:
            c.send("verify")
        assert [recv(0), recv(1)] == [("ok", "0 wrong blocks")] * 2
        for c in conns:
            c.send("read")
        assert [recv(0), recv(1)] == [("ok", "0 wrong blocks read")] * 2
        for c in conns:
            c.send("close")
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
