# SPDX-License-Identifier: Apache-2.0
"""The two sides of the two-process kvxfer.nixl tests (imported by spawned
processes): each imports ``nixl`` after kvxfer.nixl.install(), as a vLLM or
SGLang worker would, and reports ("ok", detail), ("skip", reason) or
("error", detail) over its pipe."""

import gc
import time

import numpy as np

LAYERS = 4
REGIONS = 2 * LAYERS  # K and V per layer, one region each (vLLM)
NUM_BLOCKS = 16
BLOCK = 1024
AUX = 512

# vLLM: the decode side READs these prefill blocks into these local blocks.
READS = {
    b"req-1:0": ([3, 9, 4], [1, 2, 3]),
    b"req-3:0": ([15, 0, 7, 8], [6, 7, 8, 9]),
}
PREFIX_HIT = b"req-2:prefix-hit"
# SGLang: the prefill side WRITEs these blocks into these decode blocks.
WRITE_SRC, WRITE_DST = [2, 3, 4, 11], [12, 13, 14, 0]
KV_NOTIF, AUX_NOTIF = b"room-7:kv", b"room-7:aux"


def pattern(seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, NUM_BLOCKS * BLOCK, dtype=np.uint8) for _ in range(REGIONS)]


def blocks_of(regions, blocks):
    """Per-block descriptors over every region: index region * NUM_BLOCKS + block."""
    return [(int(r.ctypes.data) + b * BLOCK, BLOCK, 0) for r in regions for b in range(blocks)]


def block(region, b):
    return region[b * BLOCK:(b + 1) * BLOCK]


def make_agent(name, lanes, **conf):
    from nixl._api import nixl_agent, nixl_agent_config

    if lanes == "loopback":  # both sides as threads of one process
        conf["kvxfer_options"] = {"backends": ["LOOPBACK"]}
    elif lanes == "ucx":  # UCX's puts and gets over its tcp transport (no RDMA here)
        conf["kvxfer_options"] = {
            "engine_config": {"KVXFER_LANES": "ucx", "KVXFER_RMA": "on", "TLS": "tcp"}}
    else:
        conf["kvxfer_options"] = {"engine_config": {"KVXFER_LANES": lanes}}
    return nixl_agent(name, nixl_agent_config(**conf))


def wait_done(agent, handles, timeout=30.0):
    deadline = time.monotonic() + timeout
    pending = list(handles)
    while pending:
        pending = [h for h in pending if agent.check_xfer_state(h) != "DONE"]
        assert time.monotonic() < deadline, f"{len(pending)} transfers did not finish"


def wait_notifs(agent, sender, expected, timeout=30.0):
    deadline = time.monotonic() + timeout
    got = []
    while sorted(got) != sorted(expected):
        got += agent.get_new_notifs().get(sender, [])
        assert time.monotonic() < deadline, f"notifications {got} of {expected}"
        time.sleep(0.001)
    return got


def run(role, conn, lanes):
    try:
        import kvxfer.nixl

        kvxfer.nixl.install()  # before anything imports nixl, as a worker would
        globals()[role](conn, lanes)
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send(("error", f"{role}: {type(exc).__name__}: {exc}"))
        raise


def vllm_prefill(conn, lanes):
    """Holds the KV blocks the decode side reads; takes its notifications."""
    regions = pattern(1)
    agent = make_agent("vllm-prefill", lanes, num_threads=4, capture_telemetry=True)
    descs = agent.get_reg_descs([(int(r.ctypes.data), r.nbytes, 0, "") for r in regions], "DRAM")
    agent.register_memory(descs, backends=["UCX"])
    conn.send(("meta", agent.get_agent_metadata(), [int(r.ctypes.data) for r in regions]))
    sender = conn.recv()
    got = wait_notifs(agent, sender, [*READS, PREFIX_HIT])
    conn.send(("ok", sorted(got)))
    assert conn.recv() == "close"
    agent.deregister_memory(descs, backends=["UCX"])
    conn.send(("ok", "closed"))


def vllm_decode(conn, lanes):
    """vLLM's NixlConnectorWorker, reduced: READs scattered blocks of every
    region with a notification, a prefix hit by send_notif, telemetry of
    every finished transfer, then removal and deregistration."""
    regions = [np.zeros(NUM_BLOCKS * BLOCK, np.uint8) for _ in range(REGIONS)]
    agent = make_agent("vllm-decode", lanes, num_threads=4, capture_telemetry=True)
    descs = agent.get_reg_descs([(int(r.ctypes.data), r.nbytes, 0, "") for r in regions], "DRAM")
    agent.register_memory(descs, backends=["UCX"])
    metadata, remote_addrs = conn.recv()
    name = agent.add_remote_agent(metadata)
    local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", agent.get_xfer_descs(blocks_of(regions, NUM_BLOCKS), "DRAM"))
    remote_descs = [(a + b * BLOCK, BLOCK, 0) for a in remote_addrs for b in range(NUM_BLOCKS)]
    remote = agent.prep_xfer_dlist(name, agent.get_xfer_descs(remote_descs, "DRAM"))
    handles = []
    for notif, (src, dst) in READS.items():
        ridx = np.array([r * NUM_BLOCKS + b for r in range(REGIONS) for b in src], np.int64)
        lidx = np.array([r * NUM_BLOCKS + b for r in range(REGIONS) for b in dst], np.int64)
        handle = agent.make_prepped_xfer("READ", local, lidx, remote, ridx, notif_msg=notif)
        assert agent.transfer(handle) in ("PROC", "DONE")
        handles.append((handle, len(lidx)))
    wait_done(agent, [h for h, _ in handles])
    for handle, count in handles:
        t = agent.get_xfer_telemetry(handle)
        assert t.totalBytes == count * BLOCK and 1 <= t.descCount <= count, t
        assert t.xferDuration >= t.postDuration > 0, t
        agent.release_xfer_handle(handle)
    agent.send_notif(name, notif_msg=PREFIX_HIT)
    expected = pattern(1)
    wrong = sum(
        not np.array_equal(block(regions[r], d), block(expected[r], s))
        for src, dst in READS.values() for r in range(REGIONS) for s, d in zip(src, dst))
    untouched = set(range(NUM_BLOCKS)) - {d for _, dst in READS.values() for d in dst}
    stray = sum(block(regions[r], b).any() for r in range(REGIONS) for b in untouched)
    conn.send(("ok" if wrong == stray == 0 else "error", f"{wrong} wrong blocks, {stray} stray"))
    assert conn.recv() == "close"
    agent.release_dlist_handle(local)
    agent.release_dlist_handle(remote)
    agent.remove_remote_agent(name)
    agent.deregister_memory(descs)
    conn.send(("ok", "closed"))


def sglang_decode(conn, lanes):
    """Holds the KV and aux buffers the prefill side WRITEs into; checks them
    once both notifications came."""
    regions = [np.zeros(NUM_BLOCKS * BLOCK, np.uint8) for _ in range(REGIONS)]
    aux = np.zeros(AUX, np.uint8)
    agent = make_agent("sglang-decode", lanes)
    agent.register_memory([(int(r.ctypes.data), r.nbytes, 0, "") for r in [*regions, aux]], "DRAM")
    conn.send(("meta", agent.get_agent_metadata(), [int(r.ctypes.data) for r in [*regions, aux]]))
    sender = conn.recv()
    wait_notifs(agent, sender, [KV_NOTIF, AUX_NOTIF])
    expected = pattern(2)
    wrong = sum(
        not np.array_equal(block(regions[r], d), block(expected[r], s))
        for r in range(REGIONS) for s, d in zip(WRITE_SRC, WRITE_DST))
    aux_ok = np.array_equal(aux, np.arange(AUX, dtype=np.uint64).astype(np.uint8))
    conn.send(("ok" if wrong == 0 and aux_ok else "error", f"{wrong} wrong blocks, aux {aux_ok}"))
    assert conn.recv() == "close"
    conn.send(("ok", "closed"))


def sglang_prefill(conn, lanes):
    """SGLang's NixlKVManager, reduced: the backend made after the agent, Nx3
    numpy lists, WRITEs with notifications, handles never released."""
    from nixl._api import nixl_thread_sync_t  # noqa: F401 - imported as SGLang does

    regions = pattern(2)
    aux = np.arange(AUX, dtype=np.uint64).astype(np.uint8)
    agent = make_agent("sglang-prefill", lanes, backends=[], num_threads=8,
                       sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT)
    agent.create_backend("UCX", {"num_threads": "8"})
    assert "UCX" in agent.get_plugin_list()
    agent.register_memory([(int(r.ctypes.data), r.nbytes, 0, "") for r in [*regions, aux]], "DRAM")
    metadata, remote_addrs = conn.recv()
    name = agent.add_remote_agent(metadata)
    src = np.array([[int(r.ctypes.data) + b * BLOCK, BLOCK, 0] for r in regions for b in WRITE_SRC], np.uint64)
    dst = np.array([[a + b * BLOCK, BLOCK, 0] for a in remote_addrs[:REGIONS] for b in WRITE_DST], np.uint64)
    local = agent.prep_xfer_dlist("", src, "DRAM")
    remote = agent.prep_xfer_dlist(name, dst, "DRAM")
    kv = agent.make_prepped_xfer("WRITE", local, list(range(len(src))), remote, list(range(len(dst))), KV_NOTIF)
    agent.transfer(kv)
    aux_local = agent.get_xfer_descs(np.array([[int(aux.ctypes.data), AUX, 0]], np.uint64), "DRAM")
    aux_remote = agent.get_xfer_descs(np.array([[remote_addrs[REGIONS], AUX, 0]], np.uint64), "DRAM")
    side = agent.initialize_xfer("WRITE", aux_local, aux_remote, name, AUX_NOTIF)
    agent.transfer(side)
    wait_done(agent, [kv, side])
    del kv, side  # never released: the handles' finalizers release them
    gc.collect()
    agent.get_new_notifs()
    assert agent._inflight == {}, agent._inflight
    conn.send(("ok", "written"))
    assert conn.recv() == "close"
    conn.send(("ok", "closed"))
