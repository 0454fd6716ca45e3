# SPDX-License-Identifier: Apache-2.0
"""Notifications: write_blocks/read_blocks(notify=...), send_notification and
get_notifications, on the loopback engine."""

import numpy as np
import pytest


def wait_done(t, peer, tid):
    for _ in range(1000):
        result = t.poll(peer)
        assert not result.failed, result
        if tid in result.done:
            return
    pytest.fail(f"transfer {tid} did not complete")


def test_write_with_notify_reaches_the_peer_after_its_bytes(pair):
    a, b = pair
    tid = a.write_blocks("b", [0, 1], [5, 6], notify=b"blocks 5,6")
    wait_done(a, "b", tid)
    notes = b.get_notifications()
    assert notes == {a.agent_name: [b"blocks 5,6"]}
    assert np.array_equal(b.pool[5:7], a.pool[0:2])
    assert b.get_notifications() == {}


@pytest.mark.parametrize("message", [b"x", bytearray(b"yz"), memoryview(b"mem"), b"\0" * 4096])
def test_send_notification_takes_bytes_like_messages(pair, message):
    a, b = pair
    tid = a.send_notification("b", message)
    wait_done(a, "b", tid)
    assert b.get_notifications() == {a.agent_name: [bytes(message)]}


def test_read_with_notify_and_positional_notify(pair):
    a, b = pair
    tid = a.read_blocks("b", [3], [4], b"read 4")
    wait_done(a, "b", tid)
    assert b.get_notifications() == {a.agent_name: [b"read 4"]}
    assert np.array_equal(a.pool[3], b.pool[4])


def test_bad_messages(pair):
    a, b = pair
    with pytest.raises(ValueError):
        a.send_notification("b", b"")
    with pytest.raises(ValueError):
        a.send_notification("b", b"x" * 4097)
    with pytest.raises(ValueError):
        a.write_blocks("b", [0], [0], notify=b"")
    with pytest.raises(ValueError):
        a.write_blocks("b", [0], [0], notify=b"x" * 4097)
    with pytest.raises(TypeError):
        a.send_notification("b", "text is not bytes")
    with pytest.raises(TypeError):
        a.write_blocks("b", [0], [0], notify=12)
    assert a.send_notification("nobody", b"x") is None
    assert b.get_notifications() == {}


def test_order_is_kept_per_sender(make_agent):
    from conftest import connect

    a, c, b = make_agent(), make_agent(), make_agent()
    connect(a, b, "b")
    connect(c, b, "b")
    for i in range(20):
        a.send_notification("b", b"a%d" % i)
        c.send_notification("b", b"c%d" % i)
    notes = b.get_notifications()
    assert notes[a.agent_name] == [b"a%d" % i for i in range(20)]
    assert notes[c.agent_name] == [b"c%d" % i for i in range(20)]


def test_nixl_transport_passes_notify_through(make_agent):
    import kvxfer
    from conftest import connect

    pool = np.zeros((4, 64), np.uint8)
    with kvxfer.NixlTransport("nixl-notifier", memoryview(pool), backends=["LOOPBACK"]) as a:
        b = make_agent(num_blocks=4)
        connect(a, b, "b")
        tid = a.write_blocks("b", [0], [1], notify=b"done")
        wait_done(a, "b", tid)
        assert b.get_notifications() == {"nixl-notifier": [b"done"]}


def test_a_sender_name_that_is_not_utf8_loses_no_notification():
    # get_notifications() turns what the core took (its queues already
    # emptied) into the dict through this function; a tcp peer's hello may
    # carry any bytes as its name. Nothing of it may be lost, no sender's
    # messages may land under another's name.
    from kvxfer import _kvxfer

    taken = [(b"\xff", [b"one", b"two"]), (b"peer-b", [b"three"]), (b"\\xff", [b"four"])]
    notes = _kvxfer._notifications_to_python(taken)
    assert notes == {"\udcff": [b"one", b"two"], "peer-b": [b"three"], "\\xff": [b"four"]}
    assert "\udcff".encode("utf-8", "surrogateescape") == b"\xff"
