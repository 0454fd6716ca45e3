# SPDX-License-Identifier: Apache-2.0
"""A same-host target whose pool is followed by a guard region it never
registered (imported by spawned processes): any byte that changes there was
written past its pool."""

import numpy as np

GUARD_BYTE = 0xA5


def run(name: str, num_blocks: int, block_len: int, guard_blocks: int, conn, engine_config: dict):
    """Sends its registration (metadata, base, num_blocks, block_len), then
    answers "guard" with the number of guard bytes changed, until "close"."""
    try:
        import kvxfer

        memory = np.zeros((num_blocks + guard_blocks, block_len), np.uint8)
        memory[num_blocks:] = GUARD_BYTE
        pool = memory[:num_blocks]
        with kvxfer.Transport(
            name, memoryview(pool), backends=["UCX"], engine_config=engine_config
        ) as t:
            conn.send((t.get_agent_metadata(), t.base_addr, t.num_blocks, t.block_len))
            while (request := conn.recv()) != "close":
                assert request == "guard", request
                conn.send(int(np.count_nonzero(memory[num_blocks:] != GUARD_BYTE)))
        conn.send("closed")
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
