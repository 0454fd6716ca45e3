# SPDX-License-Identifier: Apache-2.0
"""The GIL is released around calls that can wait, and the library's log
records reach logging.getLogger("kvxfer") from any thread."""

import logging
import threading
import time

import pytest

import kvxfer
from conftest import connect


def count_while(call) -> int:
    """Runs call() on a thread; returns how often this thread looped meanwhile."""
    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.05)  # let it enter the call
    loops = 0
    while thread.is_alive():
        loops += 1
        time.sleep(0)
    thread.join()
    return loops


def test_registration_releases_the_gil(make_agent):
    a, b = make_agent(), make_agent()
    a.fault_plan.set_connect_delay_ms(400)
    loops = count_while(lambda: connect(a, b, "b"))
    assert loops > 100  # this thread ran while the other waited in C++
    assert a.stats()["live"]["peers"] == 1


def test_calls_wait_for_a_registration_holding_the_lock_without_deadlock(make_agent, kvxfer_log):
    # The registration worker logs while holding the transport's lock; the
    # log bridge needs the GIL, so every call must let go of it while it
    # waits for that lock.
    kvxfer_log(logging.DEBUG)
    a, b = make_agent(), make_agent()
    a.fault_plan.set_connect_delay_ms(50)
    futures = [
        a.add_remote_peer_async(
            f"b{i}", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
        )
        for i in range(5)
    ]
    deadline = time.monotonic() + 10
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline
        a.poll()
        a.stats()
        assert a.available
    assert [f.result() for f in futures] == [None] * 5


def test_concurrent_writers_and_pollers(pair):
    a, _ = pair
    done = []

    def writer():
        for i in range(500):
            assert a.write_blocks("b", [i % 16], [i % 16]) is not None

    def poller():
        deadline = time.monotonic() + 10
        while len(done) < 1000 and time.monotonic() < deadline:
            done.extend(a.poll("b").done)

    threads = [threading.Thread(target=writer) for _ in range(2)] + [threading.Thread(target=poller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.extend(a.poll("b").done)
    assert len(set(done)) == 1000


def test_warnings_reach_the_kvxfer_logger(make_agent, kvxfer_log):
    log = kvxfer_log(logging.WARNING)
    a = make_agent()
    a.write_blocks("ghost", [0], [0])
    records = [r for r in log.records if r.name == "kvxfer"]
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "unknown peer=ghost" in records[0].getMessage()


def test_info_records_follow_the_logger_level(make_agent, kvxfer_log):
    log = kvxfer_log(logging.WARNING)
    a, b = make_agent(), make_agent()
    connect(a, b, "quiet")
    assert not [r for r in log.records if "registered peer=quiet" in r.getMessage()]

    kvxfer_log(logging.INFO)
    connect(a, b, "loud")
    infos = [r for r in log.records if "registered peer=loud" in r.getMessage()]
    assert [r.levelno for r in infos] == [logging.INFO]


def registered(caplog, peer: str) -> list:
    assert kvxfer.flush_log()  # records reach logging from the library's log thread
    return [r for r in caplog.records if f"registered peer={peer}" in r.getMessage()]


@pytest.fixture
def levels():
    """Sets loggers' levels as an application would (setLevel, nothing else:
    no kvxfer.sync_log_level()), restoring them at teardown. caplog's own
    handler is left at NOTSET, so it holds whatever the loggers pass on."""
    saved = {}

    def set_level(name: str, level: int) -> None:
        logger = logging.getLogger(name)
        saved.setdefault(name, logger.level)
        logger.setLevel(level)

    yield set_level
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def test_a_level_change_is_followed_without_sync_log_level(make_agent, caplog, levels):
    levels("kvxfer", logging.WARNING)
    a, b = make_agent(), make_agent()
    connect(a, b, "quiet")
    levels("kvxfer", logging.INFO)
    connect(a, b, "loud")
    assert not registered(caplog, "quiet")
    assert [r.levelno for r in registered(caplog, "loud")] == [logging.INFO]


def test_a_parent_loggers_level_is_followed(make_agent, caplog, levels):
    # kvxfer's own level unset: the root logger's decides.
    levels("kvxfer", logging.NOTSET)
    levels("", logging.WARNING)
    a, b = make_agent(), make_agent()
    levels("", logging.DEBUG)
    connect(a, b, "loud")
    assert len(registered(caplog, "loud")) == 1


def test_logging_disable_is_followed(make_agent, caplog, levels):
    levels("kvxfer", logging.INFO)
    logging.disable(logging.INFO)
    try:
        a, b = make_agent(), make_agent()
    finally:
        logging.disable(logging.NOTSET)
    connect(a, b, "loud")
    assert len(registered(caplog, "loud")) == 1


def test_records_from_the_registration_worker_thread(make_agent, kvxfer_log):
    log = kvxfer_log(logging.INFO)
    a, b = make_agent(), make_agent()
    future = a.add_remote_peer_async(
        "w", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len
    )
    future.result(timeout=10)
    records = [r for r in log.records if "registered peer=w" in r.getMessage()]
    assert len(records) == 1
    assert records[0].thread != threading.get_ident()
