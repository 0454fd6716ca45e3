# SPDX-License-Identifier: Apache-2.0
"""kvxfer.nixl with torch tensors, as vLLM's and SGLang's connectors pass
them: CPU tensors registered and described straight from the tensors, the
bytes moved between two agents checked with torch itself. Runs where torch
is importable (Debian's python3-torch); CI's machines do not install it
(about 170 packages), so elsewhere these skip and say so."""

import itertools
import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")

from kvxfer.nixl._api import nixl_agent, nixl_agent_config  # noqa: E402
from kvxfer.nixl._bindings import nixl_mem_t  # noqa: E402

_numbers = itertools.count()
LAYERS = 4
BLOCKS = 8
BLOCK_ELEMS = 512  # float16: 1 KiB a block


@pytest.fixture
def make_agent():
    made = []

    def make():
        config = nixl_agent_config(kvxfer_options={"backends": ["LOOPBACK"]})
        agent = nixl_agent(f"torch-agent-{next(_numbers)}", config)
        made.append(agent)
        return agent

    yield make
    for agent in made:
        agent._transport.close()


def kv_caches(fill):
    """K and V of each layer, as vLLM allocates them on the CPU: BLOCKS
    blocks of BLOCK_ELEMS float16 each."""
    gen = torch.Generator().manual_seed(7)
    caches = []
    for _ in range(2 * LAYERS):
        t = torch.empty((BLOCKS, BLOCK_ELEMS), dtype=torch.float16)
        if fill:
            t.copy_(torch.randn((BLOCKS, BLOCK_ELEMS), generator=gen).to(torch.float16))
        else:
            t.zero_()
        caches.append(t)
    return caches


def wait(agent, handle, timeout=10.0):
    deadline = time.monotonic() + timeout
    while (state := agent.check_xfer_state(handle)) == "PROC":
        assert time.monotonic() < deadline, "the transfer did not finish"
    return state


def test_registration_and_descriptors_come_from_the_tensors(make_agent):
    agent = make_agent()
    caches = kv_caches(fill=False)
    reg = agent.get_reg_descs(caches)
    assert reg.getType() == nixl_mem_t.DRAM_SEG
    assert len(reg) == len(caches)
    for row, t in zip(reg._rows.tolist(), caches):
        assert row[0] == t.data_ptr()
        assert row[1] == t.numel() * t.element_size()
    agent.register_memory(reg)
    single = agent.get_xfer_descs(caches[0])
    assert len(single) == 1
    agent.deregister_memory(reg)


def test_writes_between_tensors_land_byte_for_byte(make_agent):
    a, b = make_agent(), make_agent()
    src, dst = kv_caches(fill=True), kv_caches(fill=False)
    a.register_memory(a.get_reg_descs(src))
    b.register_memory(b.get_reg_descs(dst))
    peer = a.add_remote_agent(b.get_agent_metadata())
    handle = a.initialize_xfer("WRITE", a.get_xfer_descs(src), a.get_xfer_descs(dst), peer, b"kv")
    assert a.transfer(handle) in ("DONE", "PROC")
    assert wait(a, handle) == "DONE"
    for s, d in zip(src, dst):
        assert torch.equal(s, d)
    assert b.get_new_notifs() == {a.name: [b"kv"]}


def test_reads_of_scattered_blocks_land_in_their_places(make_agent):
    a, b = make_agent(), make_agent()
    ours, theirs = kv_caches(fill=False), kv_caches(fill=True)
    a.register_memory(a.get_reg_descs(ours))
    b.register_memory(b.get_reg_descs(theirs))
    peer = a.add_remote_agent(b.get_agent_metadata())
    block_bytes = BLOCK_ELEMS * 2

    def per_block(tensors):
        return [(t.data_ptr() + i * block_bytes, block_bytes, 0) for t in tensors for i in range(BLOCKS)]

    local = a.prep_xfer_dlist("NIXL_INIT_AGENT", per_block(ours), "DRAM")
    remote = a.prep_xfer_dlist(peer, per_block(theirs), "DRAM")
    picks = [3, 17, 40, 63]  # (cache, block) = (0, 3), (2, 1), (5, 0), (7, 7)
    handle = a.make_prepped_xfer("READ", local, picks, remote, picks)
    a.transfer(handle)
    assert wait(a, handle) == "DONE"
    for k in range(2 * LAYERS):
        for i in range(BLOCKS):
            if k * BLOCKS + i in picks:
                assert torch.equal(ours[k][i], theirs[k][i])
            else:
                assert not ours[k][i].any()


def test_a_tensor_that_is_not_contiguous_is_refused(make_agent):
    agent = make_agent()
    t = torch.zeros((BLOCKS, BLOCK_ELEMS), dtype=torch.float16)
    assert agent.get_reg_descs([t[:, ::2]]) is None
