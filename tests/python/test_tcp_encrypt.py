# SPDX-License-Identifier: Apache-2.0
"""KVXFER_TCP_ENCRYPT passes through engine_config untouched: two
transports on the tcp lane with encryption on move blocks and a
notification byte for byte, and one that disagrees is refused, saying
which side requires it (docs/configuration.md)."""

import re
import time

import numpy as np
import pytest

import kvxfer

from conftest import connect, pattern_pool


def tcp_transport(name, encrypt, seed):
    pool = pattern_pool(8, 4096, seed=seed)
    t = kvxfer.Transport(
        name,
        memoryview(pool),
        backends=["UCX"],
        engine_config={"KVXFER_LANES": "tcp", "KVXFER_TCP_ENCRYPT": encrypt},
    )
    t.pool = pool
    return t


def test_encrypted_write_and_notification_land():
    with tcp_transport("enc-a", "on", 1) as a, tcp_transport("enc-b", "on", 2) as b:
        connect(a, b, "b")
        tid = a.write_blocks("b", [0, 1], [5, 6], b"sealed")
        deadline = time.monotonic() + 10
        while tid not in a.poll("b").done:
            assert time.monotonic() < deadline, "the encrypted write did not complete"
        np.testing.assert_array_equal(b.pool[5:7], a.pool[0:2])
        assert b.get_notifications() == {"enc-a": [b"sealed"]}


def test_a_target_that_requires_encryption_says_so():
    with tcp_transport("plain", "off", 3) as a, tcp_transport("sealed", "on", 4) as b:
        message = "the target requires encryption (KVXFER_TCP_ENCRYPT=on there, off here)"
        with pytest.raises(RuntimeError, match=re.escape(message)):
            connect(a, b, "b")
