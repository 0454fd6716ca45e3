# SPDX-License-Identifier: Apache-2.0
"""The package's surface: names, properties, PollResult, stats, view handling."""

import gc
import os

import numpy as np
import pytest

import kvxfer
from kvxfer import PollResult


def test_nixl_transport_is_the_drop_in_transport():
    assert issubclass(kvxfer.NixlTransport, kvxfer.Transport)
    assert kvxfer.NixlTransport is not kvxfer.Transport


def test_poll_result_is_a_named_tuple_with_optional_fault():
    result = PollResult(done=(1,), failed=(2,))
    assert result == ((1,), (2,), None)
    assert result._fields == ("done", "failed", "peer_fault")
    assert PollResult(done=(), failed=()) == PollResult((), (), None)


def test_status_enum_names_the_nixl_status_set():
    names = set(kvxfer.Status.__members__)
    assert {"SUCCESS", "IN_PROGRESS", "BACKEND", "NOT_FOUND", "REMOTE_DISCONNECT", "STALLED"} <= names
    assert kvxfer.loopback.Status is kvxfer.Status


def test_properties_describe_the_pool(make_agent):
    t = make_agent(num_blocks=12, block_len=32)
    assert t.available and not t.closed
    assert t.num_blocks == 12 and t.block_len == 32
    assert t.base_addr == t.pool.ctypes.data
    assert t.config_fingerprint == ""
    assert t.backend == "LOOPBACK"
    assert t.agent_name.startswith("agent-")
    assert isinstance(t.get_agent_metadata(), bytes)
    assert "LOOPBACK" in repr(t)


def test_stats_reports_handles_and_per_peer_counters(pair):
    a, _ = pair
    tid = a.write_blocks("b", [0, 1], [2, 3])
    a.poll("b")
    stats = a.stats()
    assert stats["live"] == {
        "memory_registrations": 1,
        "peers": 1,
        "remote_keys": 1,
        "transfers": 0,
        "requests": 0,
    }
    assert stats["inflight"] == 0 and stats["registrations_pending"] == 0
    peer = stats["peers"]["b"]
    assert peer["transfers_done"] == 1 and peer["bytes_done"] == 2 * a.block_len
    assert peer["fault"] is None and peer["strikes"] == 0 and tid is not None


def test_fault_plan_is_loopback_only(make_agent):
    t = make_agent()
    assert isinstance(t.fault_plan, kvxfer.FaultPlan)
    assert kvxfer.loopback.fault_plan(t) is not None


def test_fault_plan_counts_state_checks(pair):
    a, _ = pair
    plan = kvxfer.loopback.fault_plan(a)
    before = plan.check_count
    a.write_blocks("b", [0], [0])
    a.poll("b")
    assert plan.check_count == before + 1


# --- the view ---------------------------------------------------------------------


def loopback(view, name="view-test"):
    return kvxfer.Transport(name, view, backends=["LOOPBACK"])


def test_view_may_be_a_cast_bytearray():
    buf = bytearray(8 * 32)
    with loopback(memoryview(buf).cast("B", (8, 32))) as t:
        assert (t.num_blocks, t.block_len) == (8, 32)


def test_view_may_be_a_numpy_array_or_its_memoryview():
    pool = np.zeros((4, 16), np.uint8)
    for view in (pool, memoryview(pool)):
        with loopback(view) as t:
            assert t.base_addr == pool.ctypes.data


@pytest.mark.parametrize(
    "view, message",
    [
        (np.zeros(64, np.uint8), "view must be 2-D"),
        (np.zeros((2, 4, 8), np.uint8), "view must be 2-D"),
        (np.zeros((4, 16), np.int32), "itemsize 1"),
        (np.zeros((4, 32), np.uint8)[:, ::2], "C-contiguous"),
        (np.zeros((0, 16), np.uint8), "at least one block"),
        (memoryview(bytes(64)).cast("B", (4, 16)), "writable"),
    ],
)
def test_bad_views_raise_value_error_naming_view(view, message):
    with pytest.raises(ValueError, match=message):
        loopback(view)


def test_read_only_numpy_view_is_refused():
    pool = np.zeros((4, 16), np.uint8)
    pool.flags.writeable = False
    with pytest.raises(ValueError, match="view must be writable"):
        loopback(pool)


def test_a_view_without_the_buffer_protocol_raises_type_error():
    with pytest.raises(TypeError, match="view must be a 2-D writable buffer"):
        loopback([[0] * 16] * 4)


def test_the_transport_keeps_its_view_alive_and_pinned(make_agent):
    b = make_agent(num_blocks=4, block_len=16)
    buf = bytearray(range(64))
    t = loopback(memoryview(buf).cast("B", (4, 16)), name="pinned")
    with pytest.raises(BufferError):
        buf.extend(b"x")  # exported: cannot move while the transport lives
    t.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
    del buf
    gc.collect()
    tid = t.write_blocks("b", [1], [2])
    assert t.poll("b").done == (tid,)
    assert bytes(b.pool[2]) == bytes(range(16, 32))
    t.close()
    del t
    gc.collect()


def test_the_view_is_released_with_the_transport():
    buf = bytearray(64)
    t = loopback(memoryview(buf).cast("B", (4, 16)), name="released")
    t.close()
    del t
    gc.collect()
    buf.extend(b"x")  # no export left


def test_unknown_options_raise_type_error():
    with pytest.raises(TypeError, match="progres_thread"):
        kvxfer.Transport("x", np.zeros((1, 8), np.uint8), backends=["LOOPBACK"], progres_thread=False)


def test_unsupported_backend_raises_value_error():
    with pytest.raises(ValueError, match="no supported backend"):
        kvxfer.Transport("x", np.zeros((1, 8), np.uint8), backends=["GDS"])


def test_stats_carries_the_engines_own_counters(make_agent):
    assert make_agent().stats()["engine_counters"] == {}
    pool = np.zeros((4, 64), np.uint8)
    try:
        t = kvxfer.Transport("ucx-counters", pool, backends=["UCX"], engine_config={"TLS": "tcp"})
    except RuntimeError as exc:
        pytest.skip(f"the UCX engine is unavailable: {exc}")
    with t:
        counters = t.stats()["engine_counters"]
    # Remote peers on a host without RDMA take the tcp lane, same-host peers
    # the same-host lane: both count from zero.
    assert {"tcp_writes", "tcp_reads", "tcp_bytes_sent", "cma_bytes"} <= set(counters)
    assert all(isinstance(v, int) for v in counters.values())
    # The lanes' counters; the pool's pre-touch counts pages from the start.
    lanes = {k: v for k, v in counters.items() if not k.startswith("pretouch_")}
    assert all(v == 0 for v in lanes.values())


def _mapped_files():
    with open("/proc/self/maps") as maps:
        return {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}


def test_info_names_the_files_this_process_loaded():
    info = kvxfer.info()
    assert info["version"] == kvxfer.__version__
    assert os.path.realpath(info["package"]) == os.path.realpath(os.path.dirname(kvxfer.__file__))
    assert os.path.dirname(os.path.realpath(info["extension"])) == os.path.realpath(info["package"])
    # The library is whatever file the loader mapped the C++ core from: a
    # libkvxfer.so.N in a build tree or a package.
    library = os.path.realpath(info["library"])
    assert os.path.basename(library).startswith("libkvxfer.so.")
    assert library in _mapped_files()


def test_shared_pool_is_a_zeroed_writable_uint8_array_of_the_asked_shape():
    pool = kvxfer.shared_pool(8, 4096)
    assert pool.shape == (8, 4096)
    assert pool.dtype == np.uint8
    assert pool.flags.c_contiguous and pool.flags.writeable
    assert not pool.any()
    pool[7, 4095] = 200
    view = pool[7]
    del pool  # the view keeps the memory alive
    assert view[4095] == 200


@pytest.mark.parametrize("num_blocks,block_len", [(0, 4096), (4, 0), (-1, 64), (2**62, 2**62)])
def test_shared_pool_refuses_impossible_sizes(num_blocks, block_len):
    with pytest.raises(ValueError):
        kvxfer.shared_pool(num_blocks, block_len)


def test_a_transport_registers_a_shared_pool_as_its_pool():
    pool = kvxfer.shared_pool(4, 256)
    with kvxfer.Transport("shared-0", memoryview(pool), backends=["LOOPBACK"]) as t:
        assert t.base_addr == pool.ctypes.data
        assert (t.num_blocks, t.block_len) == (4, 256)
