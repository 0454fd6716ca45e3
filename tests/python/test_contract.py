# SPDX-License-Identifier: Apache-2.0
"""The reference NixlTransport's observable contract, scenario by scenario,
on the LOOPBACK engine (two transports in one process are peers)."""

import logging
import time

import numpy as np
import pytest

import kvxfer
from kvxfer import PollResult, Status
from conftest import connect

EMPTY = PollResult(done=(), failed=())


def landed(src, dst, local: int, remote: int) -> bool:
    return np.array_equal(dst.pool[remote], src.pool[local])


# --- unknown peers and ids ---------------------------------------------------


def test_write_to_unknown_peer_returns_none_and_warns(make_agent, kvxfer_log):
    a = make_agent()
    log = kvxfer_log(logging.WARNING)
    assert a.write_blocks("nobody", [0], [0]) is None
    warnings = [r for r in log.records if r.name == "kvxfer" and r.levelno == logging.WARNING]
    assert any("nobody" in r.getMessage() for r in warnings)
    assert a.stats()["inflight"] == 0


def test_transfer_ids_are_unique_ints(pair):
    a, _ = pair
    ids = [a.write_blocks("b", [i % 16], [(i * 7) % 16]) for i in range(64)]
    assert all(type(tid) is int for tid in ids)
    assert len(set(ids)) == len(ids)
    assert sorted(a.poll("b").done) == sorted(ids)


# --- classification ------------------------------------------------------------


def test_poll_classifies_done_failed_and_in_progress(pair):
    a, b = pair
    plan = a.fault_plan
    done = a.write_blocks("b", [1], [2])
    plan.hold_next()
    held = a.write_blocks("b", [3], [4])
    failed = a.write_blocks("b", [5], [6])
    plan.finish_with(failed, Status.BACKEND)

    result = a.poll("b")

    assert result == PollResult(done=(done,), failed=(failed,), peer_fault=None)
    assert landed(a, b, 1, 2)
    assert not landed(a, b, 3, 4)  # held: still in flight, nothing written
    assert a.stats()["inflight"] == 1
    plan.land(held)
    assert landed(a, b, 3, 4)
    assert a.poll("b") == PollResult(done=(held,), failed=())
    assert a.poll("b") == EMPTY


def test_empty_polls_return_one_shared_value(pair):
    a, _ = pair
    assert a.poll("b") is a.poll() is a.poll("nobody")
    assert a.poll("b") == EMPTY
    assert isinstance(a.poll("b").done, tuple) and isinstance(a.poll("b").failed, tuple)


def test_scoped_poll_leaves_siblings_completions(make_agent):
    a, b, c = make_agent(), make_agent(), make_agent()
    connect(a, b, "b")
    connect(a, c, "c")
    to_b = a.write_blocks("b", [0], [0])
    to_c = a.write_blocks("c", [1], [1])

    assert a.poll("b") == PollResult(done=(to_b,), failed=())
    assert a.poll("b") == EMPTY
    assert a.poll("c") == PollResult(done=(to_c,), failed=())


def test_unscoped_poll_drains_every_peer(make_agent):
    a, b, c = make_agent(), make_agent(), make_agent()
    connect(a, b, "b")
    connect(a, c, "c")
    ids = [a.write_blocks("b", [0], [0]), a.write_blocks("c", [1], [1])]
    assert a.poll() == PollResult(done=tuple(sorted(ids)), failed=())
    assert a.poll("b") == EMPTY and a.poll("c") == EMPTY


# --- cancel --------------------------------------------------------------------


def test_immediate_cancel_forgets_transfers_but_their_writes_still_land(pair):
    a, b = pair
    a.fault_plan.hold_next()
    tid = a.write_blocks("b", [7], [8])

    assert a.cancel([tid]) == []
    assert a.stats()["inflight"] == 0
    a.fault_plan.land(tid)  # as a real in-flight WRITE would
    assert landed(a, b, 7, 8)
    assert a.poll("b") == EMPTY


def test_cancel_ignores_unknown_ids(pair):
    a, _ = pair
    assert a.cancel([12345, -1]) == []
    assert a.cancel([12345], mode="wait") == []


def test_wait_cancel_releases_finished_transfers_and_returns_in_flight_ones(pair):
    a, _ = pair
    a.fault_plan.hold_next()
    held = a.write_blocks("b", [0], [0])
    finished = a.write_blocks("b", [1], [1])

    assert a.cancel([held, finished], mode="wait") == [held]
    assert a.stats()["inflight"] == 1
    a.fault_plan.land(held)
    assert a.cancel([held], mode="wait") == []
    assert a.stats()["inflight"] == 0
    assert a.poll("b") == EMPTY  # cancelled transfers are never reported


def test_wait_cancel_of_a_transfer_that_later_lands_completes_through_poll(pair):
    a, b = pair
    a.fault_plan.hold_next()
    tid = a.write_blocks("b", [2], [3])

    assert a.cancel([tid], mode="wait") == [tid]
    a.fault_plan.land(tid)
    assert a.poll("b") == PollResult(done=(tid,), failed=())
    assert landed(a, b, 2, 3)


def test_wait_cancel_with_a_failing_check_keeps_the_transfer_and_faults_the_peer(pair):
    a, _ = pair
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_checks(tid, Status.BACKEND)

    assert a.cancel([tid], mode="wait") == [tid]
    assert a.poll("b") == PollResult(done=(), failed=(), peer_fault="state check failed: BACKEND")


def test_wait_cancel_with_a_remote_disconnect_check_drops_the_transfer(pair):
    a, _ = pair
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_checks(tid, Status.REMOTE_DISCONNECT)

    assert a.cancel([tid], mode="wait") == []
    assert a.stats()["inflight"] == 0
    assert a.poll("b") == PollResult(done=(), failed=(), peer_fault="REMOTE_DISCONNECT")


def test_wait_cancel_whose_release_fails_keeps_the_transfer(pair):
    a, _ = pair
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_next_releases(Status.BACKEND)

    assert a.cancel([tid], mode="wait") == [tid]
    assert a.poll("b") == PollResult(done=(tid,), failed=())


# --- peers -----------------------------------------------------------------------


def test_remove_drains_only_that_peers_transfers(make_agent):
    a, b, c = make_agent(), make_agent(), make_agent()
    connect(a, b, "b")
    connect(a, c, "c")
    a.fault_plan.hold_next(2)
    to_b = a.write_blocks("b", [0], [0])
    to_c = a.write_blocks("c", [1], [1])

    a.remove_remote_peer("b")

    stats = a.stats()
    assert stats["inflight"] == 1 and list(stats["peers"]) == ["c"]
    assert a.write_blocks("b", [0], [0]) is None
    a.fault_plan.land(to_c)
    # b's transfer had not landed when b went: reported failed, once.
    assert a.poll() == PollResult(done=(to_c,), failed=(to_b,))
    assert a.poll() == EMPTY


def test_a_removed_peers_ids_are_reported_by_its_next_scoped_poll(pair):
    a, b = pair
    landed_id = a.write_blocks("b", [1], [1])  # the loopback lands it in the post
    a.fault_plan.hold_next()
    held = a.write_blocks("b", [2], [2])

    a.remove_remote_peer("b")

    assert a.poll("b") == PollResult(done=(landed_id,), failed=(held,))
    assert a.poll("b") == EMPTY
    assert landed(a, b, 1, 1) and not landed(a, b, 2, 2)


def test_re_adding_a_peer_tears_the_old_registration_down_first(pair):
    a, b = pair
    a.fault_plan.hold_next()
    old = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_next_posts(Status.BACKEND, 3)
    for _ in range(3):
        assert a.write_blocks("b", [1], [1]) is None
    assert a.poll("b").peer_fault is not None

    connect(a, b, "b")

    stats = a.stats()
    assert stats["inflight"] == 0 and stats["live"]["peers"] == 1
    assert stats["peers"]["b"]["fault"] is None and stats["peers"]["b"]["strikes"] == 0
    new = a.write_blocks("b", [2], [2])
    assert new != old
    # The old registration's transfer had not landed: failed, reported once.
    assert a.poll("b") == PollResult(done=(new,), failed=(old,))
    assert a.poll("b") == EMPTY


def test_a_check_reporting_remote_disconnect_fails_and_drains_the_transfer(pair):
    a, _ = pair
    a.fault_plan.hold_next()
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_checks(tid, Status.REMOTE_DISCONNECT)

    assert a.poll("b") == PollResult(done=(), failed=(tid,), peer_fault="REMOTE_DISCONNECT")
    assert a.stats()["inflight"] == 0
    # The first cause sticks, and every scoped poll reports it until removal.
    assert a.poll("b") == PollResult(done=(), failed=(), peer_fault="REMOTE_DISCONNECT")
    a.remove_remote_peer("b")
    assert a.poll("b") == EMPTY


def test_a_check_raising_another_status_keeps_the_transfer_and_faults_the_peer(pair, kvxfer_log):
    a, _ = pair
    log = kvxfer_log(logging.WARNING)
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_checks(tid, Status.BACKEND)

    fault = "state check failed: BACKEND"
    assert a.poll("b") == PollResult(done=(), failed=(), peer_fault=fault)
    assert a.poll("b") == PollResult(done=(), failed=(), peer_fault=fault)
    assert a.stats()["inflight"] == 1  # the WRITE may still be landing
    check_warnings = [r for r in log.records if "check failed for transfer_id" in r.getMessage()]
    assert len(check_warnings) == 1  # warns once, then at debug
    a.fault_plan.clear_check_error(tid)
    assert a.poll("b") == PollResult(done=(tid,), failed=(), peer_fault=fault)


def test_a_disconnected_peer_fails_posts_and_is_faulted_at_once(pair):
    a, b = pair
    a.fault_plan.disconnect(b.agent_name)
    assert a.write_blocks("b", [0], [0]) is None
    assert a.poll("b").peer_fault == "REMOTE_DISCONNECT"


def test_strike_limit_faults_the_peer(pair):
    a, _ = pair
    a.fault_plan.fail_next_posts(Status.BACKEND, 3)
    for _ in range(2):
        assert a.write_blocks("b", [0], [0]) is None
        assert a.poll("b").peer_fault is None
    assert a.write_blocks("b", [0], [0]) is None

    fault = a.poll("b").peer_fault
    assert fault is not None and fault.startswith("3 consecutive transfer failures")
    assert a.stats()["peers"]["b"]["post_failures"] == 3


def test_a_success_between_failures_resets_the_strikes(pair):
    a, _ = pair
    a.fault_plan.fail_next_posts(Status.BACKEND, 2)
    assert a.write_blocks("b", [0], [0]) is None
    assert a.write_blocks("b", [0], [0]) is None
    ok = a.write_blocks("b", [0], [0])
    assert a.poll("b") == PollResult(done=(ok,), failed=())
    a.fault_plan.fail_next_posts(Status.BACKEND, 2)
    assert a.write_blocks("b", [0], [0]) is None
    assert a.write_blocks("b", [0], [0]) is None
    assert a.poll("b").peer_fault is None
    assert a.stats()["peers"]["b"]["strikes"] == 2


def test_failed_transfers_count_as_strikes(pair):
    a, _ = pair
    ids = [a.write_blocks("b", [i], [i]) for i in range(3)]
    for tid in ids:
        a.fault_plan.finish_with(tid, Status.BACKEND)
    result = a.poll("b")
    assert result.failed == tuple(ids)
    assert result.peer_fault.startswith("3 consecutive transfer failures")


def test_strike_limit_is_an_option(make_agent):
    a, b = make_agent(strike_limit=1), make_agent()
    connect(a, b, "b")
    a.fault_plan.fail_next_posts(Status.BACKEND)
    assert a.write_blocks("b", [0], [0]) is None
    assert a.poll("b").peer_fault.startswith("1 consecutive transfer failures")


def test_stall_timeout_faults_a_peer_whose_transfer_stays_in_progress(make_agent):
    a, b = make_agent(stall_timeout=0.05), make_agent()
    connect(a, b, "b")
    a.fault_plan.hold_next()
    tid = a.write_blocks("b", [0], [0])
    time.sleep(0.1)
    result = a.poll("b")
    assert result.done == () and result.failed == ()
    assert result.peer_fault.startswith("STALLED")
    a.fault_plan.land(tid)
    assert a.poll("b").done == (tid,)


def test_negative_stall_timeout_is_refused(make_agent):
    with pytest.raises(ValueError, match="stall_timeout"):
        make_agent(stall_timeout=-1)


# --- async registration ------------------------------------------------------------


def test_async_registration_resolves_its_future(make_agent):
    a, b = make_agent(), make_agent()
    future = a.add_remote_peer_async(
        "b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    assert future.result(timeout=10) is None
    tid = a.write_blocks("b", [0], [0])
    assert a.poll("b") == PollResult(done=(tid,), failed=())


def test_async_registration_does_not_block_the_caller(make_agent):
    a, b = make_agent(), make_agent()
    a.fault_plan.set_connect_delay_ms(300)
    start = time.monotonic()
    future = a.add_remote_peer_async(
        "b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    assert time.monotonic() - start < 0.2
    assert not future.done()
    assert a.write_blocks("b", [0], [0]) is None  # not published yet
    future.result(timeout=10)
    assert a.write_blocks("b", [0], [0]) is not None


def test_async_registration_superseded_by_a_remove_fails_with_runtime_error(make_agent):
    a, b = make_agent(), make_agent()
    a.fault_plan.set_connect_delay_ms(200)
    future = a.add_remote_peer_async(
        "b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    a.remove_remote_peer("b")

    error = future.exception(timeout=10)
    assert isinstance(error, RuntimeError) and isinstance(error, kvxfer.SupersededError)
    assert "peer b" in str(error) and "superseded" in str(error)
    assert a.write_blocks("b", [0], [0]) is None  # never published
    assert a.stats()["live"]["peers"] == 0  # its handles were released


def test_async_registration_superseded_by_a_re_add(make_agent):
    a, b = make_agent(), make_agent()
    a.fault_plan.set_connect_delay_ms(200)
    first = a.add_remote_peer_async(
        "b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    second = a.add_remote_peer_async(
        "b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    assert isinstance(first.exception(timeout=10), kvxfer.SupersededError)
    assert second.result(timeout=10) is None
    assert a.stats()["live"]["peers"] == 1


def test_async_registration_with_bad_metadata_fails_its_future(make_agent):
    a = make_agent()
    future = a.add_remote_peer_async("b", b"not metadata", 0x1000, 16, 64)
    assert isinstance(future.exception(timeout=10), ValueError)


def test_a_failed_connect_fails_the_registration(pair):
    a, b = pair
    a.fault_plan.fail_next_connects(Status.BACKEND, 2)
    with pytest.raises(RuntimeError, match="BACKEND"):
        connect(a, b, "b2")
    future = a.add_remote_peer_async(
        "b3", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    with pytest.raises(RuntimeError, match="BACKEND"):
        future.result(timeout=10)


# --- close -------------------------------------------------------------------------


def test_close_releases_everything(make_agent):
    a, b, c = make_agent(), make_agent(), make_agent()
    connect(a, b, "b")
    connect(a, c, "c")
    a.fault_plan.hold_next()
    a.write_blocks("b", [0], [0])
    a.write_blocks("c", [1], [1])
    assert a.stats()["live"]["transfers"] == 2

    a.close()

    stats = a.stats()
    assert set(stats["live"].values()) == {0}
    assert stats["inflight"] == 0 and stats["peers"] == {}
    assert not a.available and a.closed
    a.close()  # idempotent


def test_a_release_that_fails_stays_counted_until_close_releases_it(pair):
    a, _ = pair
    tid = a.write_blocks("b", [0], [0])
    a.fault_plan.fail_next_releases(Status.BACKEND)
    assert a.poll("b") == PollResult(done=(tid,), failed=())
    assert a.stats()["inflight"] == 0
    assert a.stats()["live"]["transfers"] == 1  # the engine still holds it

    a.close()

    assert set(a.stats()["live"].values()) == {0}


def test_calls_after_close_raise_runtime_error(pair):
    a, b = pair
    a.close()
    calls = [
        lambda: a.write_blocks("b", [0], [0]),
        lambda: a.poll("b"),
        lambda: a.poll(),
        lambda: a.cancel([1]),
        lambda: a.get_agent_metadata(),
        lambda: connect(a, b, "b"),
        lambda: a.add_remote_peer_async(
            "b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
        ),
        lambda: a.remove_remote_peer("b"),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_close_fails_pending_async_registrations(make_agent):
    a, b = make_agent(), make_agent()
    a.fault_plan.set_connect_delay_ms(200)
    futures = [
        a.add_remote_peer_async(
            f"b{i}", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
        )
        for i in range(3)
    ]
    a.close()
    for future in futures:
        assert isinstance(future.exception(timeout=10), kvxfer.SupersededError)
    assert set(a.stats()["live"].values()) == {0}


def test_context_manager_closes(make_agent):
    b = make_agent()
    pool = np.zeros((4, 64), np.uint8)
    with kvxfer.Transport("ctx", memoryview(pool), backends=["LOOPBACK"]) as t:
        connect(t, b, "b")
        assert t.available
    assert not t.available
    assert set(t.stats()["live"].values()) == {0}
