# SPDX-License-Identifier: Apache-2.0
"""kvxfer: one-sided WRITEs of KV-cache blocks between LLM-serving processes.

kvxfer.NixlTransport is the drop-in for vLLM's NixlTransport;
kvxfer.Transport is the same with strict argument checks::

    import numpy as np
    import kvxfer

    pool = np.zeros((num_blocks, block_len), dtype=np.uint8)
    t = kvxfer.Transport("engine-0", memoryview(pool))
    t.add_remote_peer("peer-1", metadata, base_addr, num_blocks, block_len)
    tid = t.write_blocks("peer-1", np.array([0, 1], np.int64), np.array([5, 6], np.int64))
    result = t.poll("peer-1")          # PollResult(done=(tid,), failed=(), peer_fault=None)

Log records go to logging.getLogger("kvxfer"), handed over by the library's
log thread a little after the call that logged them; kvxfer.flush_log() waits
for them. The library drops, before formatting them, the records that logger
would not pass on, and follows a change of its level (setLevel on it or a
parent, logging.disable) at the next call into kvxfer or the next record,
with no call of kvxfer.sync_log_level().

`kvxfer ARGS` (the console script) and `python3 -m kvxfer ARGS` run the C++
kvxfer tool shipped in the package (kvxfer/__main__.py).
"""

from ._kvxfer import (
    FaultPlan,
    Status,
    SupersededError,
    __version__,
    flush_log,
    shared_pool,
    sync_log_level,
)
from ._transport import (
    NixlTransport,
    PollResult,
    Telemetry,
    TransferRecord,
    Transport,
    config_fingerprint,
)
from . import loopback
from . import _kvxfer


def info() -> dict:
    """Where this kvxfer comes from: version, package dir, extension, library.

    A machine may hold several copies (a build tree, a pip venv, the Debian
    package); this says which one the running interpreter imported, and which
    libkvxfer the extension's loader picked. `python3 -m kvxfer info` prints it.
    """
    return {
        "version": __version__,
        "package": __path__[0],
        "extension": _kvxfer.__file__,
        "library": _kvxfer.library_path(),
    }


__all__ = [
    "FaultPlan",
    "NixlTransport",
    "PollResult",
    "Status",
    "SupersededError",
    "Telemetry",
    "TransferRecord",
    "Transport",
    "__version__",
    "config_fingerprint",
    "flush_log",
    "info",
    "loopback",
    "shared_pool",
    "sync_log_level",
]
