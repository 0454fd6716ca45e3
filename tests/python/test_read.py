# SPDX-License-Identifier: Apache-2.0
"""read_blocks: the peer's blocks into ours, with write_blocks' argument types."""

import numpy as np
import pytest

from conftest import connect


def wait_done(t, peer, tid):
    for _ in range(1000):
        result = t.poll(peer)
        assert not result.failed, result
        if tid in result.done:
            return
    pytest.fail(f"transfer {tid} did not complete")


@pytest.mark.parametrize(
    "local, remote",
    [
        ([0, 5, 6], [9, 3, 3]),
        ((1, 2), (15, 14)),
        (np.array([7, 8], np.int64), np.array([0, 1], np.int64)),
        (np.array([7, 8], np.int32), np.array([0, 1], np.int32)),
        (np.array([7, 8], np.int32), [0, 1]),
    ],
)
def test_read_brings_the_peers_blocks(pair, local, remote):
    a, b = pair
    before = a.pool.copy()
    tid = a.read_blocks("b", local, remote)
    assert isinstance(tid, int)
    wait_done(a, "b", tid)
    for l, r in zip(list(local), list(remote)):
        assert np.array_equal(a.pool[int(l)], b.pool[int(r)])
    untouched = [i for i in range(a.num_blocks) if i not in {int(l) for l in local}]
    assert np.array_equal(a.pool[untouched], before[untouched])


def test_reads_and_writes_share_the_id_sequence(pair):
    a, _ = pair
    w = a.write_blocks("b", [0], [0])
    r = a.read_blocks("b", [1], [1])
    assert r == w + 1
    stats = a.stats()["peers"]["b"]
    a.poll("b")
    stats = a.stats()["peers"]["b"]
    assert stats["transfers_done"] == 2 and stats["reads_done"] == 1
    assert stats["read_bytes_done"] == a.block_len


def test_a_local_block_named_twice_is_a_value_error(pair):
    a, _ = pair
    before = a.pool.copy()
    with pytest.raises(ValueError):
        a.read_blocks("b", [3, 3], [0, 1])
    assert np.array_equal(a.pool, before)


def test_bad_arguments(pair):
    a, _ = pair
    with pytest.raises(ValueError):
        a.read_blocks("b", [0], [99])
    with pytest.raises(ValueError):
        a.read_blocks("b", [0, 1], [0])
    with pytest.raises(TypeError):
        a.read_blocks("b", ["x"], [0])
    with pytest.raises(TypeError):
        a.read_blocks(peer_id="b", local_idxs=[0])
    assert a.read_blocks("nobody", [0], [0]) is None


def test_keywords_work(pair):
    a, b = pair
    tid = a.read_blocks(peer_id="b", local_idxs=[4], remote_idxs=[5])
    wait_done(a, "b", tid)
    assert np.array_equal(a.pool[4], b.pool[5])


def test_immediate_cancel_of_a_held_read_lands_nothing(make_agent):
    a, b = make_agent(), make_agent()
    connect(a, b, "b")
    before = a.pool.copy()
    a.fault_plan.hold_next()
    tid = a.read_blocks("b", [2], [3])
    assert a.cancel([tid]) == []
    a.fault_plan.land(tid)
    assert np.array_equal(a.pool, before)
    assert a.stats()["live"]["requests"] == 0


def test_nixl_transport_reads_too(make_agent):
    import kvxfer

    pool = np.zeros((4, 64), np.uint8)
    with kvxfer.NixlTransport("nixl-reader", memoryview(pool), backends=["LOOPBACK"]) as a:
        b = make_agent(num_blocks=4)
        connect(a, b, "b")
        tid = a.read_blocks("b", [0], [3])
        wait_done(a, "b", tid)
        assert np.array_equal(pool[0], b.pool[3])
