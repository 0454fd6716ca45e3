# SPDX-License-Identifier: Apache-2.0
"""Index lists, modes and options: what write_blocks and cancel accept, and the
errors that name the argument at fault."""

import re

import numpy as np
import pytest

import kvxfer
from kvxfer import PollResult


@pytest.mark.parametrize(
    "make_indices",
    [
        list,
        tuple,
        lambda v: np.array(v, dtype=np.int64),
        lambda v: np.array(v, dtype=np.int32),
        lambda v: np.array(v, dtype=np.uint16),  # other dtypes are copied
        lambda v: np.array(v + v, dtype=np.int64)[::2],  # strided: copied
        lambda v: [np.int64(x) for x in v],
        lambda v: range(v[0], v[0] + len(v)),
    ],
    ids=["list", "tuple", "int64", "int32", "uint16", "strided", "np-scalars", "range"],
)
def test_index_lists_of_every_kind_write_the_right_blocks(pair, make_indices):
    a, b = pair
    local, remote = [3, 4, 5], [9, 10, 11]
    tid = a.write_blocks("b", make_indices(local), make_indices(remote))
    assert a.poll("b") == PollResult(done=(tid,), failed=())
    assert np.array_equal(b.pool[remote], a.pool[local])


def test_mixed_int32_and_int64_arrays(pair):
    a, b = pair
    tid = a.write_blocks("b", np.array([1, 2], np.int32), np.array([14, 15], np.int64))
    assert a.poll("b").done == (tid,)
    assert np.array_equal(b.pool[[14, 15]], a.pool[[1, 2]])


def test_keyword_arguments(pair):
    a, _ = pair
    tid = a.write_blocks(peer_id="b", remote_idxs=[0], local_idxs=[1])
    assert a.poll(peer_id="b").done == (tid,)


@pytest.mark.parametrize(
    "local, remote, error, message",
    [
        ([16], [0], ValueError, r"local_idxs\[0\] = 16 is out of range"),
        ([0], [16], ValueError, r"remote_idxs\[0\] = 16 is out of range"),
        ([-1], [0], ValueError, "local_idxs"),
        ([0, 1], [0], ValueError, "local_idxs has 2 entries but remote_idxs has 1"),
        ([], [], ValueError, "at least one block"),
        ([0, 1], [5, 5], ValueError, "remote_idxs repeats block 5"),
        ([0.5], [0], TypeError, r"local_idxs\[0\] must be an int"),
        ([0], ["1"], TypeError, r"remote_idxs\[0\] must be an int"),
        ("01", [0, 1], TypeError, "local_idxs must be a sequence of ints"),
        (3, [0], TypeError, "local_idxs must be a sequence of ints"),
        (np.zeros((1, 1), np.int64), [0], ValueError, "local_idxs must be 1-D"),
        ([2**70], [0], OverflowError, r"local_idxs\[0\] = 1180591620717411303424 does not fit"),
        ([0], [2**63], OverflowError, r"remote_idxs\[0\] = 9223372036854775808 does not fit"),
        ({0: 1}, [0], TypeError, r"local_idxs must be a sequence of ints .*\{0: 1\} \(dict"),
        ([0], {1}, TypeError, r"remote_idxs must be a sequence of ints .*\(set"),
        ((i for i in [0]), [0], TypeError, "local_idxs must be a sequence of ints"),
        (iter([0]), [0], TypeError, "local_idxs must be a sequence of ints"),
    ],
)
def test_bad_indices_raise_naming_the_argument(pair, local, remote, error, message):
    a, _ = pair
    with pytest.raises(error, match=message):
        a.write_blocks("b", local, remote)
    assert a.stats()["peers"]["b"]["strikes"] == 0  # caller mistakes never count


def test_write_blocks_argument_errors(pair):
    a, _ = pair
    with pytest.raises(TypeError, match="missing required argument 'remote_idxs'"):
        a.write_blocks("b", [0])
    with pytest.raises(TypeError, match="unexpected keyword argument 'idxs'"):
        a.write_blocks("b", [0], [0], idxs=[0])
    with pytest.raises(TypeError, match="peer_id must be a str"):
        a.write_blocks(b"b", [0], [0])
    with pytest.raises(TypeError, match="peer_id must be a str"):
        a.poll(7)


@pytest.mark.parametrize("mode", ["Immediate", "soon", None, 1])
def test_cancel_mode_must_be_immediate_or_wait(pair, mode):
    a, _ = pair
    with pytest.raises(ValueError, match="mode must be"):
        a.cancel([1], mode=mode)


def test_cancel_accepts_any_iterable_of_ids(pair):
    a, _ = pair
    a.fault_plan.hold_next(2)
    ids = [a.write_blocks("b", [0], [0]), a.write_blocks("b", [1], [1])]
    assert a.cancel(np.array(ids), mode="wait") == ids
    assert a.cancel(iter(ids)) == []
    assert a.stats()["inflight"] == 0
    with pytest.raises(TypeError, match="transfer_ids"):
        a.cancel(None)


def test_config_fields_take_any_json_value():
    # The reference's configs hold ints and bools; they used to raise TypeError.
    with kvxfer.Transport(
        "x", np.zeros((1, 8), np.uint8), config_fields={"block_size": 16}, backends=["LOOPBACK"]
    ) as t:
        assert t.config_fingerprint == "addf234ab11ac58f"


def test_agent_metadata_must_be_bytes(pair):
    a, b = pair
    with pytest.raises(TypeError, match="agent_metadata must be bytes"):
        a.add_remote_peer("c", "text", b.base_addr, b.num_blocks, b.block_len)


def test_a_notify_over_4096_bytes_raises_naming_notify(pair):
    a, _ = pair
    with pytest.raises(ValueError, match="notify must hold at most 4096 bytes; got 4097"):
        a.write_blocks("b", [0], [0], notify=b"x" * 4097)
    assert a.stats()["peers"]["b"]["strikes"] == 0


def add_peer_args(b, **changes):
    args = dict(
        peer_id="c",
        agent_metadata=b.get_agent_metadata(),
        base_addr=b.base_addr,
        num_blocks=b.num_blocks,
        block_len=b.block_len,
    )
    args.update(changes)
    return args


@pytest.mark.parametrize(
    "name, value, error, message",
    [
        ("peer_id", 7, TypeError, r"peer_id must be a str; got 7 \(int\)"),
        ("peer_id", b"c", TypeError, r"peer_id must be a str; got b'c' \(bytes of length 1\)"),
        ("peer_id", "\udcff", ValueError, "peer_id must be a str that UTF-8 can encode"),
        ("base_addr", "0x1000", TypeError, r"base_addr must be an int; got '0x1000' \(str"),
        ("base_addr", -1, ValueError, "base_addr must be >= 0; got -1"),
        ("base_addr", 2**64, OverflowError, "base_addr = 18446744073709551616 .*does not fit"),
        ("num_blocks", 16.0, TypeError, r"num_blocks must be an int; got 16.0 \(float\)"),
        ("num_blocks", True, TypeError, "num_blocks must be an int; got True"),
        ("block_len", None, TypeError, r"block_len must be an int; got None \(NoneType\)"),
        ("agent_metadata", "text", TypeError, "agent_metadata must be bytes"),
    ],
)
def test_add_remote_peer_names_the_argument_of_the_wrong_type(pair, name, value, error, message):
    a, b = pair
    for call in (a.add_remote_peer, a._add_remote_peer_async):
        with pytest.raises(error, match=message):
            call(**add_peer_args(b, **{name: value}))
    assert a.peers() == ["b"]


def test_a_wrong_type_error_shortens_what_was_given(pair):
    # The metadata passed as the wrong argument: named, not pasted whole.
    a, b = pair
    metadata = b.get_agent_metadata()
    with pytest.raises(TypeError) as raised:
        a.add_remote_peer(metadata, metadata, b.base_addr, b.num_blocks, b.block_len)
    text = str(raised.value)
    # repr() quotes bytes holding a ' with "
    assert re.match(r"peer_id must be a str; got b['\"]KVXFMETA", text), text
    assert f"(bytes of length {len(metadata)})" in text and len(text) < 120


def test_numpy_integers_are_ints_for_add_remote_peer(pair):
    a, b = pair
    a.add_remote_peer(
        "c",
        b.get_agent_metadata(),
        np.uint64(b.base_addr),
        np.int64(b.num_blocks),
        np.int32(b.block_len),
    )
    assert a.peers() == ["b", "c"]


@pytest.mark.parametrize(
    "call",
    [
        lambda t: t.remove_remote_peer(7),
        lambda t: t.send_notification(7, b"x"),
        lambda t: t.write_blocks(7, [0], [0]),
        lambda t: t.poll(7),
    ],
    ids=["remove_remote_peer", "send_notification", "write_blocks", "poll"],
)
def test_peer_id_of_the_wrong_type_is_named(pair, call):
    a, _ = pair
    with pytest.raises(TypeError, match=r"peer_id must be a str; got 7 \(int\)"):
        call(a)


@pytest.mark.parametrize("cls", [kvxfer.Transport, kvxfer.NixlTransport])
def test_agent_name_of_the_wrong_type_is_named(cls):
    with pytest.raises(TypeError, match=r"agent_name must be a str; got b'x' \(bytes"):
        cls(b"x", np.zeros((1, 8), np.uint8), backends=["LOOPBACK"])


def test_garbage_metadata_is_reported_before_the_geometry(pair):
    a, b = pair
    with pytest.raises(ValueError, match="not kvxfer metadata"):
        a.add_remote_peer("c", b"garbage", b.base_addr, b.num_blocks, 1)
    with pytest.raises(ValueError, match="not kvxfer metadata"):
        a.add_remote_peer("c", b"garbage", b.base_addr, 0, b.block_len)


def test_bad_peer_geometry_raises_value_error(pair):
    a, b = pair
    with pytest.raises(ValueError, match="block_len"):
        a.add_remote_peer("c", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len * 2)
    with pytest.raises(ValueError, match="geometry"):
        a.add_remote_peer("c", b.get_agent_metadata(), b.base_addr + 64, b.num_blocks, b.block_len)
