# SPDX-License-Identifier: Apache-2.0
"""The loopback engine, for testing tier code without a network.

A Transport made with ``backends=["LOOPBACK"]`` reaches the other LOOPBACK
transports of the same process; a WRITE is a memcpy into the peer's pool.
Its FaultPlan scripts every failure a real engine can produce::

    plan = kvxfer.loopback.fault_plan(t)
    plan.fail_next_posts(kvxfer.Status.BACKEND)       # next write_blocks -> None
    plan.hold_next()                                   # next transfer stays in flight...
    tid = t.write_blocks("peer", [0], [0])
    plan.land(tid)                                     # ...until its bytes land
    plan.fail_checks(tid, kvxfer.Status.REMOTE_DISCONNECT)
    plan.disconnect("peer-agent-name")                 # the peer is gone

FaultPlan methods: fail_next_posts(status, count=1), fail_checks(id, status),
clear_check_error(id), finish_with(id, status), hold_next(count=1), land(id),
fail_next_releases(status, count=1), fail_next_connects(status, count=1),
fail_next_disconnects(status, count=1), disconnect(agent_name),
reconnect(agent_name), set_connect_delay_ms(ms), and the check_count
property (state checks made so far).
"""

from typing import Any

from ._kvxfer import FaultPlan, Status

__all__ = ["FaultPlan", "Status", "fault_plan"]


def fault_plan(transport: Any) -> FaultPlan:
    """The FaultPlan of a LOOPBACK transport (the same as ``transport.fault_plan``)."""
    plan = transport.fault_plan
    if plan is None:
        raise ValueError(
            f"transport {transport.agent_name!r} uses the {transport.backend} engine; "
            "only LOOPBACK transports have a fault plan"
        )
    return plan
