# SPDX-License-Identifier: Apache-2.0
"""Transport.telemetry(): opt-in per-transfer records, as named tuples."""

import time

import numpy as np
import pytest

import kvxfer

from conftest import connect


def drain(t, peer, expected):
    reported = 0
    for _ in range(1000):
        r = t.poll(peer)
        reported += len(r.done) + len(r.failed)
        if reported >= expected:
            break
    assert reported == expected


def test_records_match_the_transfers_made(make_agent):
    a, b = make_agent(telemetry=True), make_agent()
    connect(a, b, "b")
    before = time.monotonic()
    ids = [a.write_blocks("b", np.array([i, i + 4]), np.array([i, i + 4])) for i in range(3)]
    ids.append(a.read_blocks("b", np.array([12]), np.array([1])))
    drain(a, "b", 4)
    after = time.monotonic()

    t = a.telemetry()
    assert isinstance(t, kvxfer.Telemetry)
    assert t.dropped == 0
    assert sorted(r.id for r in t.records) == sorted(ids)
    for r in t.records:
        assert isinstance(r, kvxfer.TransferRecord)
        assert r.peer == "b"
        assert r.result == "done"
        assert r.lane == ""
        # On time.monotonic()'s clock: the hot path's TSC readings are
        # converted to it within far less than this slack.
        slack = 1e-4
        assert before - slack <= r.posted <= r.completed <= after + slack
        if r.id == ids[3]:
            assert (r.op, r.blocks, r.bytes) == ("read", 1, 64)
        else:
            assert (r.op, r.blocks, r.bytes) == ("write", 2, 128)
    assert a.telemetry() == kvxfer.Telemetry([], 0)


def test_a_full_ring_drops_the_oldest_and_counts_them(make_agent):
    a, b = make_agent(telemetry=True, telemetry_capacity=2), make_agent()
    connect(a, b, "b")
    ids = []
    for i in range(5):
        ids.append(a.write_blocks("b", np.array([i]), np.array([i])))
        drain(a, "b", 1)
    t = a.telemetry()
    assert t.dropped == 3
    assert [r.id for r in t.records] == ids[3:]


def test_failed_and_cancelled(make_agent):
    a, b = make_agent(telemetry=True), make_agent()
    connect(a, b, "b")
    plan = kvxfer.loopback.fault_plan(a)
    tid = a.write_blocks("b", np.array([1]), np.array([1]))
    plan.finish_with(tid, kvxfer.Status.BACKEND)
    drain(a, "b", 1)
    plan.hold_next()
    held = a.write_blocks("b", np.array([2]), np.array([2]))
    assert a.cancel([held]) == []
    assert [(r.id, r.result) for r in a.telemetry().records] == [(tid, "failed"), (held, "cancelled")]


def test_off_by_default_means_empty(pair):
    a, _ = pair
    a.write_blocks("b", np.array([0]), np.array([0]))
    drain(a, "b", 1)
    assert a.telemetry() == kvxfer.Telemetry([], 0)


@pytest.mark.parametrize("capacity", [0, -1, 2**24 + 1, 2**64])
def test_bad_capacity_raises(make_agent, capacity):
    with pytest.raises(ValueError, match="telemetry_capacity must be from 1 to 16777216"):
        make_agent(telemetry=True, telemetry_capacity=capacity)


@pytest.mark.parametrize("capacity", [0, -1, 2**64])
def test_capacity_is_not_checked_with_telemetry_off(make_agent, capacity):
    # As in C++ (docs/configuration.md): off, no ring is made.
    a = make_agent(telemetry_capacity=capacity)
    assert a.available and a.telemetry() == kvxfer.Telemetry([], 0)


@pytest.mark.parametrize("telemetry", [True, False])
def test_capacity_of_the_wrong_type_raises_either_way(make_agent, telemetry):
    with pytest.raises(TypeError, match="telemetry_capacity must be an int"):
        make_agent(telemetry=telemetry, telemetry_capacity="16")
