# SPDX-License-Identifier: Apache-2.0
"""Every numeric option is checked before C++ sees it: a bad value raises
ValueError naming the option, a value of the wrong type TypeError naming it,
for kvxfer.Transport and the drop-in alike."""

import math
import time

import numpy as np
import pytest

import kvxfer

YEAR_S = 365 * 24 * 3600


def make(cls=kvxfer.Transport, **options):
    return cls("opts", np.zeros((4, 8), np.uint8), backends=["LOOPBACK"], **options)


CLASSES = [kvxfer.Transport, kvxfer.NixlTransport]

BAD_VALUES = [
    # option, value, error
    ("stall_timeout", math.inf, ValueError),
    ("stall_timeout", -math.inf, ValueError),
    ("stall_timeout", math.nan, ValueError),
    ("stall_timeout", -1, ValueError),
    ("stall_timeout", -0.001, ValueError),
    ("stall_timeout", YEAR_S + 1, ValueError),
    ("stall_timeout", 1e300, ValueError),
    ("stall_timeout", 10**400, ValueError),  # too big for a float
    ("stall_timeout", np.float64("nan"), ValueError),
    ("stall_timeout", "30", TypeError),
    ("stall_timeout", None, TypeError),
    ("stall_timeout", True, TypeError),
    ("strike_limit", 0, ValueError),
    ("strike_limit", -1, ValueError),
    ("strike_limit", 2**31, ValueError),  # too big for a C int
    ("strike_limit", 2**64, ValueError),
    ("strike_limit", 3.0, TypeError),
    ("strike_limit", math.inf, TypeError),
    ("strike_limit", math.nan, TypeError),
    ("strike_limit", "3", TypeError),
    ("strike_limit", None, TypeError),
    ("strike_limit", True, TypeError),
    ("num_threads", 0, ValueError),
    ("num_threads", -4, ValueError),
    ("num_threads", 2**31, ValueError),
    ("num_threads", 2**100, ValueError),
    ("num_threads", 4.0, TypeError),
    ("num_threads", math.inf, TypeError),
    ("num_threads", math.nan, TypeError),
    ("num_threads", "4", TypeError),
    ("num_threads", None, TypeError),
    ("num_threads", False, TypeError),
    ("progress_thread", 1, TypeError),
    ("progress_thread", "no", TypeError),
    ("progress_thread", None, TypeError),
]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "option, value, error", BAD_VALUES, ids=[f"{o}={v!r}"[:40] for o, v, _ in BAD_VALUES]
)
def test_a_bad_option_value_raises_naming_the_option(cls, option, value, error):
    with pytest.raises(error, match=option):
        make(cls, **{option: value})


@pytest.mark.parametrize(
    "option, value",
    [
        ("stall_timeout", 0),
        ("stall_timeout", 0.0),
        ("stall_timeout", 0.0001),  # rounds up to 1 ms, not down to 0 (off)
        ("stall_timeout", 30),
        ("stall_timeout", np.float32(2.5)),
        ("stall_timeout", YEAR_S),
        ("strike_limit", 1),
        ("strike_limit", np.int64(5)),
        ("strike_limit", 2**31 - 1),
        ("num_threads", 1),
        ("num_threads", np.int32(2)),
        ("progress_thread", False),
    ],
)
def test_option_values_in_range_are_accepted(option, value):
    with make(**{option: value}) as t:
        assert t.available


def test_a_tiny_stall_timeout_still_faults_a_stalled_peer(make_agent):
    # 0.0001 s must not turn into 0 ms, which would turn the check off.
    a, b = make_agent(stall_timeout=0.0001), make_agent()
    a.add_remote_peer("b", b.get_agent_metadata(), b.base_addr, b.num_blocks, b.block_len)
    a.fault_plan.hold_next()
    tid = a.write_blocks("b", [0], [0])
    assert tid is not None
    deadline = time.monotonic() + 10  # generous: the stall is due after 1 ms
    while (fault := a.poll("b").peer_fault) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    assert fault is not None and "STALLED" in fault


def test_config_fields_must_be_a_dict():
    with pytest.raises(TypeError, match="config_fields must be a dict"):
        make(config_fields=[("model", "x")])


def test_config_fields_must_be_json_serialisable():
    with pytest.raises(TypeError, match="config_fields must be JSON-serialisable"):
        make(config_fields={"model": object()})
    with pytest.raises(TypeError, match="config_fields must be JSON-serialisable"):
        make(config_fields={"a": 1, 2: "b"})  # sort_keys cannot order str and int


def test_backends_must_be_a_list_not_a_string():
    with pytest.raises(TypeError, match="backends"):
        kvxfer.Transport("opts", np.zeros((4, 8), np.uint8), backends="LOOPBACK")


def test_repr_of_a_transport_whose_construction_failed_does_not_crash():
    # Tracebacks (pytest's among them) repr the half-made object in __init__'s
    # frame; asking C++ about a transport that was never made used to crash.
    made = []

    class Spy(kvxfer.Transport):
        def __init__(self, *args, **kwargs):
            made.append(self)
            super().__init__(*args, **kwargs)

    with pytest.raises(ValueError, match="stall_timeout"):
        Spy("spy", np.zeros((4, 8), np.uint8), backends=["LOOPBACK"], stall_timeout=-1)
    assert repr(made[0]) == "<kvxfer.Spy (not constructed)>"
