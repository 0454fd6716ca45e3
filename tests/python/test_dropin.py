# SPDX-License-Identifier: Apache-2.0
"""kvxfer.NixlTransport answers like the reference NixlTransport wherever
the native kvxfer.Transport deliberately differs (python/README.md lists each
difference); one test per difference, with the native answer beside it."""

import logging
import threading
import time

import numpy as np
import pytest

import kvxfer
from conftest import connect


@pytest.fixture
def dropin(make_agent):
    """(a, b): a drop-in NixlTransport with b (a plain Transport) as peer "b"."""
    made = []

    def make():
        pool = np.random.default_rng(len(made)).integers(0, 256, (16, 64), dtype=np.uint8)
        t = kvxfer.NixlTransport(f"dropin-{id(pool)}", memoryview(pool), backends=["LOOPBACK"])
        t.pool = pool
        made.append(t)
        return t

    a, b = make(), make_agent()
    connect(a, b, "b")
    yield a, b
    for t in made:
        t.close()


# A failed post in the reference: NIXL refuses the indices.
BAD_WRITES = [
    ([16], [0], "local index past the end"),
    ([0], [16], "remote index past the end"),
    ([-1], [0], "negative local index"),
    ([0], [-1], "negative remote index"),
    ([0, 1], [0], "lists of different lengths"),
    ([], [], "empty write"),
    ([0, 1], [5, 5], "a remote block named twice"),
    ([2**40], [0], "an index beyond int32"),
]


@pytest.mark.parametrize("local, remote, what", BAD_WRITES, ids=[w for *_, w in BAD_WRITES])
def test_bad_indices_are_a_failed_post_not_an_exception(dropin, kvxfer_log, local, remote, what):
    a, b = dropin
    log = kvxfer_log(logging.WARNING)
    before = b.pool.copy()
    assert a.write_blocks("b", local, remote) is None
    stats = a.stats()["peers"]["b"]
    assert stats["post_failures"] == 1
    assert stats["strikes"] == 1
    assert any("write_blocks failed for peer=b" in r.getMessage() for r in log.records)
    assert np.array_equal(b.pool, before) and a.stats()["inflight"] == 0


def test_native_transport_still_raises_for_bad_indices(pair):
    a, _ = pair
    for local, remote, _ in BAD_WRITES:
        with pytest.raises(ValueError):
            a.write_blocks("b", local, remote)
    assert a.stats()["peers"]["b"]["post_failures"] == 0


def test_strike_limit_failed_posts_fault_the_peer(dropin):
    a, _ = dropin
    for _ in range(3):
        assert a.write_blocks("b", [99], [0]) is None
    fault = a.poll("b").peer_fault
    assert fault is not None and "3 consecutive transfer failures" in fault
    assert "out of range" in fault


def test_a_good_write_between_failed_posts_resets_the_strikes(dropin):
    a, b = dropin
    assert a.write_blocks("b", [99], [0]) is None
    assert a.write_blocks("b", [99], [0]) is None
    tid = a.write_blocks("b", [1], [2])
    assert a.poll("b").done == [tid]
    assert np.array_equal(b.pool[2], a.pool[1])
    assert a.write_blocks("b", [99], [0]) is None
    assert a.poll("b").peer_fault is None


def test_bad_indices_to_an_unknown_peer_are_none_without_a_strike(dropin, kvxfer_log):
    a, _ = dropin
    log = kvxfer_log(logging.WARNING)
    assert a.write_blocks("nobody", [99], [0]) is None
    assert a.stats()["peers"]["b"]["post_failures"] == 0
    assert any("unknown peer=nobody" in r.getMessage() for r in log.records)


# What the reference's np.asarray(..., dtype=np.int32) refuses before its post
# raises in the drop-in too, and counts against nobody.
REFUSED_BEFORE_THE_POST = [
    ([None], [0], TypeError, r"local_idxs\[0\] must be an int"),
    ([0], [2**63], OverflowError, r"remote_idxs\[0\] = 9223372036854775808 does not fit"),
    ([-(2**63) - 1], [0], OverflowError, r"local_idxs\[0\]"),
    ({0: 1}, [0], TypeError, "local_idxs must be a sequence of ints"),
    ([0], {3}, TypeError, "remote_idxs must be a sequence of ints"),
    ((i for i in [0]), [0], TypeError, "local_idxs must be a sequence of ints"),
]


@pytest.mark.parametrize(
    "local, remote, error, message",
    REFUSED_BEFORE_THE_POST,
    ids=["None", "2**63", "-2**63-1", "dict", "set", "generator"],
)
def test_indices_numpy_refuses_raise_without_a_strike(dropin, local, remote, error, message):
    a, _ = dropin
    with pytest.raises(error, match=message):
        a.write_blocks("b", local, remote)
    stats = a.stats()["peers"]["b"]
    assert stats["post_failures"] == 0 and stats["strikes"] == 0


@pytest.mark.parametrize(
    "notify, message",
    [(b"", "at least one byte"), (b"x" * 4097, "at most 4096 bytes")],
    ids=["empty", "4097 bytes"],
)
def test_a_bad_notify_raises_without_a_strike(dropin, notify, message):
    # notify is kvxfer's own argument, which the reference does not have.
    a, _ = dropin
    with pytest.raises(ValueError, match=f"notify must hold {message}"):
        a.write_blocks("b", [0], [1], notify=notify)
    stats = a.stats()["peers"]["b"]
    assert stats["post_failures"] == 0 and stats["strikes"] == 0


def test_bad_indices_with_a_good_notify_are_still_a_failed_post(dropin):
    a, _ = dropin
    assert a.write_blocks("b", [99], [1], notify=b"x") is None
    assert a.stats()["peers"]["b"]["strikes"] == 1


def test_writes_to_a_faulted_peer_are_none_without_a_strike(dropin):
    # The reference would post them; kvxfer refuses until the peer is removed.
    a, _ = dropin
    a.fault_plan.fail_next_posts(kvxfer.Status.REMOTE_DISCONNECT)
    assert a.write_blocks("b", [0], [1]) is None
    assert a.poll("b").peer_fault is not None
    assert a.write_blocks("b", [0], [1]) is None
    stats = a.stats()["peers"]["b"]
    assert stats["posts_refused"] == 1 and stats["post_failures"] == 1


def test_transfer_ids_start_at_1(dropin):
    # The reference's ids start at 0; kvxfer's at 1, so `if tid:` is safe.
    a, _ = dropin
    assert a.write_blocks("b", [0], [1]) == 1


def test_poll_returns_lists_like_the_reference(dropin):
    a, _ = dropin
    tid = a.write_blocks("b", [0, 1], [3, 4])
    result = a.poll("b")
    assert result.done == [tid] and result.failed == []
    assert isinstance(result.done, list) and isinstance(result.failed, list)
    empty = a.poll("b")
    assert empty.done == [] and empty.failed == [] and empty.peer_fault is None
    assert a.poll("b") is empty  # like the reference, one shared empty result


def test_poll_results_are_kvxfer_poll_results(dropin):
    a, _ = dropin
    tid = a.write_blocks("b", [0], [1])
    done = a.poll("b")
    empty = a.poll("b")
    a.fault_plan.fail_next_posts(kvxfer.Status.REMOTE_DISCONNECT)  # faults the peer
    assert a.write_blocks("b", [0], [1]) is None
    faulted = a.poll("b")
    assert done.done == [tid] and empty.done == [] and faulted.peer_fault is not None
    for result in (done, empty, faulted):
        assert isinstance(result, kvxfer.PollResult)
        assert isinstance(result.done, list) and isinstance(result.failed, list)


def test_native_poll_returns_tuples(pair):
    a, _ = pair
    tid = a.write_blocks("b", [0], [1])
    assert a.poll("b").done == (tid,)


def test_failed_transfers_come_back_as_a_list(dropin):
    a, _ = dropin
    a.fault_plan.fail_next_posts(kvxfer.Status.BACKEND)  # a post the engine fails
    assert a.write_blocks("b", [0], [0]) is None
    a.fault_plan.hold_next()
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.finish_with(tid, kvxfer.Status.BACKEND)
    assert a.poll("b").failed == [tid]


def test_calls_after_close_answer_like_the_reference(dropin):
    a, _ = dropin
    tid = a.write_blocks("b", [0], [1])
    a.close()
    assert a.write_blocks("b", [0], [1]) is None
    assert a.write_blocks("b", [99], [1]) is None
    result = a.poll("b")
    assert result.done == [] and result.failed == [] and result.peer_fault is None
    assert a.poll() == result
    assert a.cancel([tid]) == []
    assert a.cancel([tid], mode="wait") == []
    a.remove_remote_peer("b")  # nothing to remove: no exception


def test_native_calls_after_close_raise(pair):
    a, _ = pair
    a.close()
    for call in (
        lambda: a.write_blocks("b", [0], [1]),
        lambda: a.poll("b"),
        lambda: a.cancel([1]),
        lambda: a.remove_remote_peer("b"),
    ):
        with pytest.raises(RuntimeError):
            call()


def test_cancel_takes_any_mode_but_immediate_as_wait(dropin):
    a, _ = dropin
    a.fault_plan.hold_next()
    held = a.write_blocks("b", [0], [1])
    # "wait" keeps a transfer that can still land; "immediate" would drop it.
    assert a.cancel([held], mode="WAIT") == [held]
    assert a.cancel([held], mode=None) == [held]
    assert a.cancel([held]) == []
    assert a.stats()["inflight"] == 0


def test_cancel_skips_ids_that_are_not_ints(dropin):
    a, _ = dropin
    a.fault_plan.hold_next()
    held = a.write_blocks("b", [0], [1])
    assert a.cancel([None, "x", held, 1.5, 2**70, -1, True], mode="wait") == [held]
    assert a.cancel(iter([None, held])) == []
    assert a.stats()["inflight"] == 0


def test_native_cancel_refuses_ids_that_are_not_ints(pair):
    a, _ = pair
    with pytest.raises(TypeError, match="transfer_ids"):
        a.cancel([None])


def test_native_cancel_refuses_an_unknown_mode(pair):
    a, _ = pair
    with pytest.raises(ValueError, match="mode"):
        a.cancel([1], mode="WAIT")


def superseded_registration(a, b):
    """Registers b on a again and, while that registration connects, removes
    the peer from this thread. Returns what the registration raised."""
    outcome = []
    a.fault_plan.set_connect_delay_ms(2000)

    def register():
        try:
            connect(a, b, "b")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=register)
    thread.start()
    # Registering again tears the old registration down first: once "b" is
    # gone, the new one is connecting.
    deadline = time.monotonic() + 30
    while "b" in a.peers() and time.monotonic() < deadline:
        time.sleep(0.001)
    a.remove_remote_peer("b")
    thread.join()
    a.fault_plan.set_connect_delay_ms(0)
    return outcome[0]


def test_a_superseded_registration_returns_quietly(dropin):
    a, b = dropin
    assert superseded_registration(a, b) is None
    assert a.peers() == []


def test_native_superseded_registration_raises(pair):
    a, b = pair
    assert isinstance(superseded_registration(a, b), kvxfer.SupersededError)
    assert a.peers() == []


def test_good_writes_work_as_in_the_native_transport(dropin):
    a, b = dropin
    tid = a.write_blocks("b", np.array([3, 4], np.int64), np.array([7, 8], np.int64))
    assert a.poll("b").done == [tid]
    assert np.array_equal(b.pool[[7, 8]], a.pool[[3, 4]])
    assert a.write_blocks("nobody", [0], [0]) is None


def test_a_removed_peers_transfer_is_reported_by_the_next_poll(dropin):
    # The reference keeps in-flight transfers across remove_remote_peer and
    # reports each id when a later poll sees it end.
    a, b = dropin
    a.fault_plan.hold_next()
    held = a.write_blocks("b", [0], [0])
    done = a.write_blocks("b", [1], [1])
    a.remove_remote_peer("b")
    result = a.poll("b")
    assert isinstance(result, kvxfer.PollResult)
    assert (result.done, result.failed, result.peer_fault) == ([done], [held], None)
    assert a.cancel([held, done], "wait") == []
    assert a.poll() == kvxfer.PollResult([], [], None)
