# SPDX-License-Identifier: Apache-2.0
"""kvxfer.nixl, NIXL's agent API over kvxfer: each call's semantics and
errors, over backend LOOPBACK in this process (kvxfer_options picks it)."""

import gc
import itertools
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import kvxfer
from kvxfer import nixl as knixl
from kvxfer.nixl import _bindings as nb
from kvxfer.nixl._api import nixl_agent, nixl_agent_config

_numbers = itertools.count()
BLOCK = 256


def config(**fields):
    fields.setdefault("kvxfer_options", {"backends": ["LOOPBACK"]})
    return nixl_agent_config(**fields)


@pytest.fixture
def make_agent():
    made = []

    def make(**fields):
        agent = nixl_agent(f"nixl-agent-{next(_numbers)}", config(**fields))
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent._transport.close()


def buffer(blocks=8, seed=None):
    """A host buffer of `blocks` blocks: random bytes, or zeros without a seed."""
    if seed is None:
        return np.zeros(blocks * BLOCK, np.uint8)
    return np.random.default_rng(seed).integers(0, 256, blocks * BLOCK, dtype=np.uint8)


def addr(buf):
    return buf.ctypes.data


def block_descs(buf, blocks):
    return [(addr(buf) + i * BLOCK, BLOCK, 0) for i in range(blocks)]


class Pair:
    """Agent a (initiator) with buffer src; agent b with buffer dst; b added
    to a; per-block lists prepared on a for both."""

    def __init__(self, make_agent, blocks=8, **fields):
        self.a, self.b = make_agent(**fields), make_agent(**fields)
        self.src, self.dst = buffer(blocks, seed=1), buffer(blocks)
        self.a.register_memory([(addr(self.src), self.src.nbytes, 0, "")], "DRAM")
        self.b.register_memory([(addr(self.dst), self.dst.nbytes, 0, "")], "DRAM")
        self.peer = self.a.add_remote_agent(self.b.get_agent_metadata())
        self.local = self.a.prep_xfer_dlist("NIXL_INIT_AGENT", block_descs(self.src, blocks), "DRAM")
        self.remote = self.a.prep_xfer_dlist(self.peer, block_descs(self.dst, blocks), "DRAM")
        self.plan = self.a._transport.fault_plan

    def wait(self, handle, timeout=10.0):
        deadline = time.monotonic() + timeout
        while (state := self.a.check_xfer_state(handle)) == "PROC":
            assert time.monotonic() < deadline, "the transfer did not finish"
        return state


@pytest.fixture
def pair(make_agent):
    return Pair(make_agent)


def block(buf, i):
    return buf[i * BLOCK:(i + 1) * BLOCK]


# ---- plugins, backends, configuration ------------------------------------


def test_the_plugin_list_is_ucx(make_agent):
    agent = make_agent()
    assert agent.get_plugin_list() == ["UCX"]
    assert agent.get_backend_mem_types("UCX") == ["DRAM"]


def test_other_nixl_backends_are_not_supported_and_unknown_ones_not_found(make_agent):
    agent = make_agent()
    with pytest.raises(nb.nixlNotSupportedError, match="UCX only"):
        agent.create_backend("GDS")
    with pytest.raises(nb.nixlNotFoundError):
        agent.create_backend("UVX")


def test_config_takes_every_nixl_field_and_sglang_creates_the_backend_after_the_agent(make_agent):
    agent = make_agent(
        enable_prog_thread=True, enable_listen_thread=True, listen_port=5555,
        capture_telemetry=True, num_threads=8, backends=[],
        sync_mode=nb.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT)
    buf = buffer(1)
    with pytest.raises(nb.nixlNotFoundError, match="no backend"):
        agent.register_memory([(addr(buf), buf.nbytes, 0, "")], "DRAM")
    agent.create_backend("UCX", {"num_threads": "8"})
    assert agent.get_backend_params("UCX") == {"num_threads": "8"}
    agent.register_memory([(addr(buf), buf.nbytes, 0, "")], "DRAM")
    assert agent._transport.regions() == [(agent._transport.regions()[0][0], addr(buf), buf.nbytes)]


def test_an_empty_agent_name_raises_value_error():
    with pytest.raises(ValueError):
        nixl_agent("", config())


def test_metadata_listener_calls_are_not_supported(make_agent):
    with pytest.raises(nb.nixlNotSupportedError, match="out of band"):
        make_agent().send_local_metadata("127.0.0.1")


# ---- registration -----------------------------------------------------------


def test_register_memory_takes_tuples_and_nx3_arrays_as_regions(make_agent):
    agent = make_agent()
    one, two = buffer(2), buffer(3)
    agent.register_memory([(addr(one), one.nbytes, 0, "k")], "DRAM")
    agent.register_memory(np.array([[addr(two), two.nbytes, 0]], np.uint64), "DRAM")
    listed = sorted((a, n) for _id, a, n in agent._transport.regions())
    assert listed == sorted([(addr(one), one.nbytes), (addr(two), two.nbytes)])


def test_deregister_memory_removes_the_regions(make_agent):
    agent = make_agent()
    buf = buffer(2)
    descs = agent.register_memory([(addr(buf), buf.nbytes, 0, "")], "DRAM")
    agent.deregister_memory(descs)
    assert agent._transport.regions() == []
    with pytest.raises(nb.nixlNotFoundError):
        agent.deregister_memory(descs)


@pytest.mark.parametrize("mem", ["VRAM", "FILE", "BLOCK", "OBJ"])
def test_memory_other_than_dram_is_not_supported(make_agent, mem):
    agent = make_agent()
    buf = buffer(1)
    with pytest.raises(nb.nixlNotSupportedError, match="host memory only"):
        agent.register_memory([(addr(buf), buf.nbytes, 0, "")], mem)
    with pytest.raises(nb.nixlNotSupportedError, match="host memory only"):
        agent.prep_xfer_dlist("", [(addr(buf), buf.nbytes, 0)], mem)


def test_overlapping_registration_raises_invalid_param(make_agent):
    agent = make_agent()
    buf = buffer(2)
    agent.register_memory([(addr(buf), buf.nbytes, 0, "")], "DRAM")
    with pytest.raises(nb.nixlInvalidParamError, match="overlaps"):
        agent.register_memory([(addr(buf) + BLOCK, BLOCK, 0, "")], "DRAM")


def test_torch_tensors_register_as_dram(make_agent):
    torch = pytest.importorskip("torch")
    agent = make_agent()
    tensor = torch.zeros(1024, dtype=torch.uint8)
    agent.register_memory([tensor])
    assert [(a, n) for _i, a, n in agent._transport.regions()] == [(tensor.data_ptr(), 1024)]


# ---- metadata and peers -----------------------------------------------------


def test_add_remote_agent_returns_the_name_inside_the_metadata(make_agent):
    a, b = make_agent(), make_agent()
    assert a.add_remote_agent(b.get_agent_metadata()) == b.name.encode()
    assert a.check_remote_metadata(b.name)


def test_metadata_is_a_snapshot_taken_after_registering(make_agent):
    a, b = make_agent(), make_agent()
    early = b.get_agent_metadata()
    buf = buffer(1)
    b.register_memory([(addr(buf), buf.nbytes, 0, "")], "DRAM")
    a.add_remote_agent(early)
    with pytest.raises(nb.nixlNotFoundError):
        a.prep_xfer_dlist(b.name, [(addr(buf), BLOCK, 0)], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    a.prep_xfer_dlist(b.name, [(addr(buf), BLOCK, 0)], "DRAM")


def test_bad_metadata_raises_invalid_param(make_agent):
    with pytest.raises(nb.nixlInvalidParamError):
        make_agent().add_remote_agent(b"not metadata")


def test_remove_remote_agent_forgets_it(make_agent):
    a, b = make_agent(), make_agent()
    name = a.add_remote_agent(b.get_agent_metadata())
    a.remove_remote_agent(name)
    assert not a.check_remote_metadata(name)
    with pytest.raises(nb.nixlNotFoundError):
        a.remove_remote_agent(name)


# ---- prepared lists -----------------------------------------------------------


def test_a_remote_descriptor_that_straddles_two_regions_is_refused(make_agent):
    a, b = make_agent(), make_agent()
    buf = buffer(4)
    half = buf.nbytes // 2
    b.register_memory([(addr(buf), half, 0, ""), (addr(buf) + half, half, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    with pytest.raises(nb.nixlNotFoundError, match="descriptor 1"):
        a.prep_xfer_dlist(b.name, [(addr(buf), BLOCK, 0), (addr(buf) + half - 8, 16, 0)], "DRAM")


@pytest.mark.parametrize("where", ["before", "past the end", "longer"])
def test_a_remote_descriptor_outside_the_peers_regions_is_refused(make_agent, where):
    a, b = make_agent(), make_agent()
    buf = buffer(4)
    b.register_memory([(addr(buf) + BLOCK, 2 * BLOCK, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    desc = {"before": (addr(buf), BLOCK, 0), "past the end": (addr(buf) + 3 * BLOCK, BLOCK, 0),
            "longer": (addr(buf) + BLOCK, 3 * BLOCK, 0)}[where]
    with pytest.raises(nb.nixlNotFoundError, match="lies in no region"):
        a.prep_xfer_dlist(b.name, [desc], "DRAM")


def test_a_local_descriptor_outside_our_regions_is_refused(make_agent):
    agent = make_agent()
    buf = buffer(2)
    agent.register_memory([(addr(buf), BLOCK, 0, "")], "DRAM")
    with pytest.raises(nb.nixlNotFoundError):
        agent.prep_xfer_dlist("", [(addr(buf) + BLOCK, BLOCK, 0)], "DRAM")


def test_a_list_for_an_unknown_agent_is_refused(make_agent):
    agent = make_agent()
    with pytest.raises(nb.nixlNotFoundError, match="not registered"):
        agent.prep_xfer_dlist("nobody", [(4096, 1, 0)], "DRAM")


# ---- transfers ---------------------------------------------------------------


def test_a_prepared_write_lands_its_blocks_and_notifies(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0, 5, 2], pair.remote, [7, 1, 3], b"w1")
    assert pair.a.transfer(handle) == "PROC"
    assert pair.wait(handle) == "DONE"
    for i, j in [(0, 7), (5, 1), (2, 3)]:
        assert np.array_equal(block(pair.dst, j), block(pair.src, i))
    assert not block(pair.dst, 0).any()
    assert pair.b.get_new_notifs() == {pair.a.name: [b"w1"]}


def test_a_prepared_read_fetches_scattered_blocks(make_agent):
    p = Pair(make_agent)
    p.dst[:] = buffer(8, seed=9)
    p.src[:] = 0
    handle = p.a.make_prepped_xfer("READ", p.local, np.array([1, 4], np.int32), p.remote,
                                   np.array([6, 2], np.int64), b"read")
    p.a.transfer(handle)
    assert p.wait(handle) == "DONE"
    assert np.array_equal(block(p.src, 1), block(p.dst, 6))
    assert np.array_equal(block(p.src, 4), block(p.dst, 2))
    assert p.b.get_new_notifs() == {p.a.name: [b"read"]}


def test_initialize_xfer_writes_list_to_list(pair):
    local = pair.a.get_xfer_descs(block_descs(pair.src, 2), "DRAM")
    remote = pair.a.get_xfer_descs([(addr(pair.dst) + 6 * BLOCK, BLOCK, 0),
                                    (addr(pair.dst) + 4 * BLOCK, BLOCK, 0)], "DRAM")
    handle = pair.a.initialize_xfer("WRITE", local, remote, pair.peer, b"init")
    pair.a.transfer(handle)
    assert pair.wait(handle) == "DONE"
    assert np.array_equal(block(pair.dst, 6), block(pair.src, 0))
    assert np.array_equal(block(pair.dst, 4), block(pair.src, 1))


def test_descriptors_of_different_lengths_are_refused(pair):
    short = pair.a.prep_xfer_dlist(pair.peer, [(addr(pair.dst), BLOCK // 2, 0)], "DRAM")
    with pytest.raises(nb.nixlInvalidParamError, match="pair 0"):
        pair.a.make_prepped_xfer("WRITE", pair.local, [0], short, [0])
    local = pair.a.get_xfer_descs([(addr(pair.src), BLOCK, 0)], "DRAM")
    remote = pair.a.get_xfer_descs([(addr(pair.dst), BLOCK // 2, 0)], "DRAM")
    with pytest.raises(nb.nixlInvalidParamError, match="descriptor 0"):
        pair.a.initialize_xfer("WRITE", local, remote, pair.peer)


def test_index_lists_of_different_lengths_or_out_of_range_are_refused(pair):
    with pytest.raises(nb.nixlInvalidParamError):
        pair.a.make_prepped_xfer("WRITE", pair.local, [0, 1], pair.remote, [0])
    with pytest.raises(nb.nixlInvalidParamError, match="index 8"):
        pair.a.make_prepped_xfer("WRITE", pair.local, [8], pair.remote, [0])


def test_an_unknown_op_raises_key_error(pair):
    with pytest.raises(KeyError):
        pair.a.make_prepped_xfer("RD", pair.local, [0], pair.remote, [0])


def test_a_handle_posts_again_after_done(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [3], pair.remote, [3])
    pair.a.transfer(handle)
    assert pair.wait(handle) == "DONE"
    pair.dst[:] = 0
    pair.a.transfer(handle, b"again")
    assert pair.wait(handle) == "DONE"
    assert np.array_equal(block(pair.dst, 3), block(pair.src, 3))
    assert pair.b.get_new_notifs() == {pair.a.name: [b"again"]}


def test_posting_a_handle_in_progress_raises_repost_active(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    with pytest.raises(nb.nixlRepostActiveError):
        pair.a.transfer(handle)
    assert pair.a.check_xfer_state(handle) == "PROC"


def test_checking_a_handle_never_posted_raises_not_posted(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    with pytest.raises(nb.nixlNotPostedError):
        pair.a.check_xfer_state(handle)


def test_each_handle_keeps_its_own_completion(pair):
    first = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    second = pair.a.make_prepped_xfer("WRITE", pair.local, [1], pair.remote, [1])
    pair.a.transfer(first)
    pair.a.transfer(second)
    # Polling for the second may report the first done too: it stays the first's.
    assert pair.wait(second) == "DONE"
    assert pair.wait(first) == "DONE"


def test_a_failed_transfer_raises_backend_error(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    pair.plan.finish_with(handle._state.tid, kvxfer.Status.BACKEND)
    with pytest.raises(nb.nixlBackendError):
        pair.wait(handle)


def test_a_disconnected_peer_raises_remote_disconnect(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    pair.plan.fail_checks(handle._state.tid, kvxfer.Status.REMOTE_DISCONNECT)
    with pytest.raises(nb.nixlRemoteDisconnectError):
        pair.wait(handle)
    again = pair.a.make_prepped_xfer("WRITE", pair.local, [1], pair.remote, [1])
    with pytest.raises(nb.nixlRemoteDisconnectError):
        pair.a.transfer(again)


def test_removing_the_agent_fails_its_transfers_in_progress_with_remote_disconnect(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    pair.a.remove_remote_agent(pair.peer)
    with pytest.raises(nb.nixlRemoteDisconnectError, match="removed"):
        pair.a.check_xfer_state(handle)


def test_release_cancels_a_transfer_in_progress(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    assert pair.a._transport.stats()["inflight"] == 1
    pair.a.release_xfer_handle(handle)
    assert pair.a._transport.stats()["inflight"] == 0
    with pytest.raises(nb.nixlInvalidParamError, match="released"):
        pair.a.check_xfer_state(handle)


def test_garbage_collection_releases_a_handle_nobody_released(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    del handle
    gc.collect()
    pair.a.get_new_notifs()  # a finalizer that found the lock taken leaves it to the next call
    assert pair.a._transport.stats()["inflight"] == 0
    assert pair.a._inflight == {}


def test_a_released_dlist_handle_cannot_be_used(pair):
    pair.a.release_dlist_handle(pair.remote)
    with pytest.raises(nb.nixlInvalidParamError):
        pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])


def test_a_list_deregistered_since_it_was_prepared_is_refused_at_post(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.a.deregister_memory(pair.a.get_reg_descs([(addr(pair.src), pair.src.nbytes, 0, "")], "DRAM"))
    with pytest.raises(nb.nixlInvalidParamError, match="deregistered"):
        pair.a.transfer(handle)


# ---- telemetry -----------------------------------------------------------------


def test_telemetry_counts_merged_descriptors_bytes_and_durations(make_agent):
    p = Pair(make_agent, capture_telemetry=True)
    handle = p.a.make_prepped_xfer("WRITE", p.local, [0, 1, 2, 5], p.remote, [4, 5, 6, 0])
    p.a.transfer(handle)
    p.wait(handle)
    t = p.a.get_xfer_telemetry(handle)
    assert (t.descCount, t.totalBytes) == (2, 4 * BLOCK)
    assert t.startTime > 0 and t.postDuration > 0
    assert t.xferDuration >= t.postDuration


def test_telemetry_of_initialize_xfer_counts_every_descriptor(make_agent):
    p = Pair(make_agent, capture_telemetry=True)
    local = p.a.get_xfer_descs(block_descs(p.src, 2), "DRAM")
    remote = p.a.get_xfer_descs(block_descs(p.dst, 2), "DRAM")
    handle = p.a.initialize_xfer("WRITE", local, remote, p.peer)
    p.a.transfer(handle)
    p.wait(handle)
    assert p.a.get_xfer_telemetry(handle).descCount == 2


def test_telemetry_off_raises_no_telemetry(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.a.transfer(handle)
    pair.wait(handle)
    with pytest.raises(nb.nixlNoTelemetryError):
        pair.a.get_xfer_telemetry(handle)


def test_nixl_telemetry_enable_turns_telemetry_on(make_agent, monkeypatch):
    monkeypatch.setenv("NIXL_TELEMETRY_ENABLE", "y")
    p = Pair(make_agent)
    handle = p.a.make_prepped_xfer("WRITE", p.local, [0], p.remote, [0])
    p.a.transfer(handle)
    p.wait(handle)
    assert p.a.get_xfer_telemetry(handle).totalBytes == BLOCK


# ---- notifications and threads --------------------------------------------------


def test_send_notif_reaches_the_agent_by_name(pair):
    pair.a.send_notif(pair.peer, b"prefix-hit")
    deadline = time.monotonic() + 10
    got = {}
    while not got:
        got = pair.b.get_new_notifs()
        assert time.monotonic() < deadline
    assert got == {pair.a.name: [b"prefix-hit"]}


def test_send_notif_to_an_unknown_agent_raises_not_found(pair):
    with pytest.raises(nb.nixlNotFoundError):
        pair.a.send_notif("nobody", b"x")


def test_threads_sharing_an_agent_each_see_their_transfers_done(make_agent):
    p = Pair(make_agent, blocks=16)
    errors = []

    def worker(k):
        try:
            for _ in range(20):
                h = p.a.make_prepped_xfer("WRITE", p.local, [k], p.remote, [15 - k], f"{k}")
                p.a.transfer(h)
                assert p.wait(h) == "DONE"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in range(8):
        assert np.array_equal(block(p.dst, 15 - k), block(p.src, k))


# ---- install -------------------------------------------------------------------


def run_python(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_install_makes_import_nixl_give_kvxfer_nixl():
    result = run_python(
        "import kvxfer.nixl; kvxfer.nixl.install()\n"
        "import nixl, nixl._api, nixl._bindings, nixl._utils\n"
        "from nixl._api import nixl_agent, nixl_agent_config\n"
        "from nixl._bindings import nixlXferTelemetry, nixlRemoteDisconnectError\n"
        "assert nixl is kvxfer.nixl and nixl_agent is kvxfer.nixl.nixl_agent\n"
        "kvxfer.nixl.install()\n"
        "print('ok')\n")
    assert result.stdout.strip() == "ok", result.stderr


def test_install_refuses_when_another_nixl_is_imported():
    result = run_python(
        "import sys, types; sys.modules['nixl'] = types.ModuleType('nixl')\n"
        "import kvxfer.nixl\n"
        "try:\n    kvxfer.nixl.install()\nexcept RuntimeError as e:\n    print('refused', e)\n")
    assert result.stdout.startswith("refused"), result.stderr
    assert "already imported" in result.stdout


def test_the_package_exports_what_the_connectors_import():
    for name in ["nixl_agent", "nixl_agent_config", "nixl_xfer_handle", "nixl_prepped_dlist_handle",
                 "nixlXferTelemetry", "nixlBackendError", "nixlNotFoundError", "nixlInvalidParamError",
                 "nixlRemoteDisconnectError", "nixlCancelledError", "nixlNotSupportedError",
                 "NIXL_INIT_AGENT", "DRAM_SEG", "NIXL_READ", "NIXL_WRITE"]:
        assert hasattr(knixl, name), name
    assert knixl._api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT is not None
    assert knixl._api.nixlBind is nb


def test_adding_an_agent_again_fails_its_transfers_in_progress_with_remote_disconnect(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    pair.a.add_remote_agent(pair.b.get_agent_metadata())
    with pytest.raises(nb.nixlRemoteDisconnectError, match="registered again"):
        pair.a.check_xfer_state(handle)
    stale = pair.a.make_prepped_xfer("WRITE", pair.local, [1], pair.remote, [1])
    with pytest.raises(nb.nixlInvalidParamError, match="earlier registration"):
        pair.a.transfer(stale)


def test_a_completion_another_thread_polls_before_the_post_returns_is_kept(pair):
    post = pair.a._transport.transfer

    def post_then_poll(*args):
        tid = post(*args)
        pair.a._poll(pair.b.name)  # another thread's check, before this one hands the id over
        return tid

    pair.a._transport.transfer = post_then_poll
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.a.transfer(handle)
    assert pair.wait(handle, timeout=2.0) == "DONE"
    assert pair.a._unclaimed == {}


def test_a_peer_gone_mid_transfer_raises_remote_disconnect_then_refuses_posts(pair):
    handle = pair.a.make_prepped_xfer("WRITE", pair.local, [0], pair.remote, [0])
    pair.plan.hold_next()
    pair.a.transfer(handle)
    pair.plan.disconnect(pair.b.name)  # as a killed peer looks to the loopback engine
    with pytest.raises(nb.nixlRemoteDisconnectError):
        pair.wait(handle)
    with pytest.raises(nb.nixlRemoteDisconnectError):
        pair.a.send_notif(pair.peer, b"anyone?")
