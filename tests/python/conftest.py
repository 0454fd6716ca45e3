# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the kvxfer pytest suite: LOOPBACK transports in this process.

Run from a build tree with PYTHONPATH=<build>/python (ctest sets it).
"""

import itertools
import logging

import numpy as np
import pytest

import kvxfer

_agent_numbers = itertools.count()


def pattern_pool(num_blocks: int, block_len: int, seed: int) -> np.ndarray:
    """A pool whose every block has distinct, recognizable bytes."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(num_blocks, block_len), dtype=np.uint8)


def connect(src: kvxfer.Transport, dst: kvxfer.Transport, peer_id: str) -> None:
    """Registers dst as peer_id of src."""
    src.add_remote_peer(
        peer_id, dst.get_agent_metadata(), dst.base_addr, dst.num_blocks, dst.block_len
    )


@pytest.fixture
def make_agent():
    """make_agent(**options) -> a LOOPBACK Transport with its numpy pool as .pool.

    Pools are random bytes, so a block that lands is recognizable; agent
    names are unique in the process. Every agent is closed at teardown.
    """
    made = []

    def make(num_blocks: int = 16, block_len: int = 64, **options):
        number = next(_agent_numbers)
        pool = pattern_pool(num_blocks, block_len, seed=number)
        options.setdefault("backends", ["LOOPBACK"])
        transport = kvxfer.Transport(f"agent-{number}", memoryview(pool), **options)
        transport.pool = pool
        made.append(transport)
        return transport

    yield make
    for transport in made:
        transport.close()


@pytest.fixture
def pair(make_agent):
    """(a, b): two LOOPBACK agents, b registered on a as peer "b"."""
    a, b = make_agent(), make_agent()
    connect(a, b, "b")
    return a, b


class _Flushed:
    """caplog, whose records are read once the library's log thread has handed
    over everything logged so far (records reach logging a little after the
    call that logged them)."""

    def __init__(self, caplog):
        self._caplog = caplog

    def __getattr__(self, name):
        if name in ("records", "text", "record_tuples", "messages"):
            assert kvxfer.flush_log()
        return getattr(self._caplog, name)


@pytest.fixture
def kvxfer_log(caplog):
    """kvxfer_log(level): capture logger "kvxfer" records at `level`."""

    def at(level: int):
        caplog.set_level(level, logger="kvxfer")
        kvxfer.sync_log_level()
        return _Flushed(caplog)

    yield at
    logging.getLogger("kvxfer").setLevel(logging.NOTSET)
    kvxfer.sync_log_level()
