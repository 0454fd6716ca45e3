# SPDX-License-Identifier: Apache-2.0
"""add_remote_peer failures say why in the exception text, not only in the
log: what cannot reach the peer, and what to set."""

import os
import struct
import time

import numpy as np
import pytest

import kvxfer


def _fnv1a(data: bytes) -> int:
    h = 2166136261
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def with_fields(metadata: bytes, pid=None, boot_id=None) -> bytes:
    """The metadata (src/wire/metadata.h, version 1) with its pid or boot id
    replaced, checksum recomputed: a peer that says it lives elsewhere."""
    fixed = bytearray(metadata[:44])
    body = metadata[44:]
    strings, at = [], 0
    for _ in range(4):  # engine, agent name, fingerprint, boot id
        (n,) = struct.unpack_from("<I", body, at)
        strings.append(body[at + 4 : at + 4 + n])
        at += 4 + n
    blob = body[at:]
    if boot_id is not None:
        strings[3] = boot_id.encode()
    if pid is not None:
        struct.pack_into("<I", fixed, 36, pid)
    new_body = b"".join(struct.pack("<I", len(s)) + s for s in strings) + blob
    struct.pack_into("<I", fixed, 40, _fnv1a(new_body))
    return bytes(fixed) + new_body


def test_the_metadata_editor_keeps_metadata_valid(make_agent):
    a, b = make_agent(), make_agent()
    meta = b.get_agent_metadata()
    assert with_fields(meta) == meta
    a.add_remote_peer("b", with_fields(meta), b.base_addr, b.num_blocks, b.block_len)


def test_loopback_peer_in_another_process_says_to_use_ucx(make_agent):
    a, b = make_agent(), make_agent()
    meta = with_fields(b.get_agent_metadata(), pid=os.getpid() + 1)
    with pytest.raises(RuntimeError) as info:
        a.add_remote_peer("b", meta, b.base_addr, b.num_blocks, b.block_len)
    assert "loopback peers must be in this process" in str(info.value)
    assert "UCX" in str(info.value)


def test_async_registration_fails_its_future_with_the_reason(make_agent):
    a, b = make_agent(), make_agent()
    meta = with_fields(b.get_agent_metadata(), pid=os.getpid() + 1)
    future = a.add_remote_peer_async("b", meta, b.base_addr, b.num_blocks, b.block_len)
    with pytest.raises(RuntimeError, match="loopback peers must be in this process"):
        future.result(timeout=30)


@pytest.mark.parametrize("cls", [kvxfer.Transport, kvxfer.NixlTransport], ids=lambda c: c.__name__)
def test_ucx_peer_no_transport_reaches_names_what_must_reach_it(cls):
    # No tcp lane, UCX with shared memory only (KVXFER_RMA=on runs the UCX
    # lane without an RDMA device), and a peer on "another host": no UCX
    # transport reaches it, and the reason says what must.
    config = {"TLS": "sm,self", "KVXFER_LANES": "cma,ucx", "KVXFER_RMA": "on"}
    pools = [np.zeros((8, 64), np.uint8) for _ in range(2)]
    try:
        b = cls("reason-b", pools[0], backends=["UCX"], engine_config=config)
    except RuntimeError as exc:
        pytest.skip(f"the UCX engine is unavailable: {exc}")
    with b, cls("reason-a", pools[1], backends=["UCX"], engine_config=config) as a:
        meta = with_fields(b.get_agent_metadata(), boot_id="another-host-" + str(time.time()))
        with pytest.raises(RuntimeError) as info:
            a.add_remote_peer("b", meta, b.base_addr, b.num_blocks, b.block_len)
        text = str(info.value)
        assert "cannot register peer b" in text
        assert "creating the endpoint failed" in text
        assert "UCX must reach it over an RDMA transport, or tcp with KVXFER_RMA=on" in text
        assert a.peers() == []
