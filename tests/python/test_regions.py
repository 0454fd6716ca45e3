# SPDX-License-Identifier: Apache-2.0
"""kvxfer.Transport's region calls (register_memory, prepare, transfer...)
from Python, over LOOPBACK: transports with no pool, argument checks that
name the argument, and bytes moved between descriptor lists."""

import itertools
import time

import numpy as np
import pytest

import kvxfer
from kvxfer import _kvxfer

_numbers = itertools.count()


@pytest.fixture
def poolless():
    made = []

    def make():
        t = kvxfer.Transport(f"regions-{next(_numbers)}", None, backends=["LOOPBACK"])
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


def wait(t, peer, tid):
    deadline = time.monotonic() + 10
    while True:
        result = t.poll(peer)
        assert not result.failed, result
        if tid in result.done:
            return
        assert time.monotonic() < deadline


def test_a_transport_with_no_pool_has_none(poolless):
    t = poolless()
    assert (t.base_addr, t.num_blocks, t.block_len) == (0, 0, 0)
    assert t.regions() == []


def test_metadata_names_its_agent(poolless):
    t = poolless()
    assert _kvxfer.metadata_agent_name(t.get_agent_metadata()) == t.agent_name
    with pytest.raises(ValueError):
        _kvxfer.metadata_agent_name(b"nonsense")


def test_bytes_move_between_lists_both_ways(poolless):
    a, b = poolless(), poolless()
    src = np.arange(4096, dtype=np.uint32).view(np.uint8)[:4096].copy()
    dst = np.zeros(4096, np.uint8)
    a.register_memory(src.ctypes.data, src.nbytes)
    b.register_memory(dst.ctypes.data, dst.nbytes)
    a.add_remote_peer("b", b.get_agent_metadata())
    assert a.peer_regions("b") == [(b.regions()[0][0], dst.ctypes.data, dst.nbytes)]
    local = a.prepare(np.array([[src.ctypes.data, 1024, 0, 0], [src.ctypes.data + 1024, 1024, 0, 0]],
                               np.uint64))
    remote = a.prepare([(dst.ctypes.data + 2048, 1024), (dst.ctypes.data, 1024, 0)], "b")
    assert (len(local), remote.remote, remote.peer, remote[1]) == (2, True, "b", (dst.ctypes.data, 1024))
    wait(a, "b", a.transfer("WRITE", "b", local, None, remote, None, notify=b"n"))
    assert np.array_equal(dst[2048:3072], src[:1024]) and np.array_equal(dst[:1024], src[1024:2048])
    src[:] = 0
    wait(a, "b", a.transfer("READ", "b", local, [1], remote, np.array([0], np.int32)))
    assert np.array_equal(src[1024:2048], dst[2048:3072])
    assert b.get_notifications() == {a.agent_name: [b"n"]}


def test_descriptor_errors_name_the_descriptor(poolless):
    t = poolless()
    with pytest.raises(TypeError, match=r"descs\[1\]"):
        t.prepare([(4096, 1), 5])
    with pytest.raises(ValueError, match=r"descs\[0\]\[1\] \(len\)"):
        t.prepare([(4096, -1)])
    with pytest.raises(ValueError, match=r"descs must be an \(N, 2\)"):
        t.prepare(np.zeros((2, 5), np.uint64))
    with pytest.raises(ValueError, match="lies in no region"):
        t.prepare([(4096, 16)])


def test_transfer_checks_its_arguments(poolless):
    a, b = poolless(), poolless()
    buf = np.zeros(2048, np.uint8)
    a.register_memory(buf.ctypes.data, 1024)
    b.register_memory(buf.ctypes.data + 1024, 1024)
    a.add_remote_peer("b", b.get_agent_metadata())
    local = a.prepare([(buf.ctypes.data, 512)])
    remote = a.prepare([(buf.ctypes.data + 1024, 256)], "b")
    with pytest.raises(ValueError, match="op must be"):
        a.transfer("PUT", "b", local, None, remote, None)
    with pytest.raises(TypeError, match="remote must be a kvxfer DescList"):
        a.transfer("WRITE", "b", local, None, [(1, 2)], None)
    with pytest.raises(TypeError, match="both be index lists"):
        a.transfer("WRITE", "b", local, [0], remote, None)
    with pytest.raises(ValueError, match="pair 0 has 512 local bytes and 256"):
        a.transfer("WRITE", "b", local, [0], remote, [0])


def test_register_memory_checks_its_range(poolless):
    t = poolless()
    with pytest.raises(ValueError, match="addr must be >= 0"):
        t.register_memory(-1, 10)
    with pytest.raises(TypeError, match="length must be an int"):
        t.register_memory(4096, "10")
    with pytest.raises(ValueError, match="not a registered region"):
        t.deregister_memory(12345)


def test_telemetry_records_a_transfer_between_lists_with_no_blocks(poolless):
    a = kvxfer.Transport("regions-telemetry", None, backends=["LOOPBACK"], telemetry=True)
    try:
        b = poolless()
        buf = np.zeros(4096, np.uint8)
        a.register_memory(buf.ctypes.data, 2048)
        b.register_memory(buf.ctypes.data + 2048, 2048)
        a.add_remote_peer("b", b.get_agent_metadata())
        local = a.prepare([(buf.ctypes.data, 100)])
        remote = a.prepare([(buf.ctypes.data + 2048, 100)], "b")
        tid = a.transfer("WRITE", "b", local, None, remote, None)
        wait(a, "b", tid)
        (record,) = a.telemetry().records
        assert (record.id, record.blocks, record.bytes, record.result) == (tid, 0, 100, "done")
    finally:
        a.close()
