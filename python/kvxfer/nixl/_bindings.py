# SPDX-License-Identifier: Apache-2.0
"""What NIXL's ``nixl._bindings`` gives its users, over kvxfer.

The constants, enums, exception classes, descriptor lists and the telemetry
record that vLLM's and SGLang's NIXL connectors import. Written for kvxfer
from NIXL's public documentation; the agent itself is in ``_api``.
"""

from __future__ import annotations

import enum
from typing import Any, Union

import numpy as np

# prep_xfer_dlist's agent name for a local list (NIXL also takes the string
# "NIXL_INIT_AGENT" and "" for it).
NIXL_INIT_AGENT = ""
# NIXL's default port for its metadata listener, which kvxfer does not have.
DEFAULT_COMM_PORT = 8888


class nixl_mem_t(enum.IntEnum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


class nixl_xfer_op_t(enum.IntEnum):
    NIXL_READ = 0
    NIXL_WRITE = 1


class nixl_status_t(enum.IntEnum):
    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11


class nixl_thread_sync_t(enum.IntEnum):
    """Accepted by nixl_agent_config(sync_mode=...): every kvxfer agent may be
    shared by threads, whatever the mode."""

    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 0


class nixl_cost_t(enum.IntEnum):
    NIXL_COST_ANALYTICAL_BACKEND = 0


# NIXL exports its enums' values at module level as well.
_ENUM_VALUES: list[str] = []
for _enum in (nixl_mem_t, nixl_xfer_op_t, nixl_status_t, nixl_thread_sync_t, nixl_cost_t):
    globals().update(_enum.__members__)
    _ENUM_VALUES += list(_enum.__members__)
del _enum


class _NixlError(Exception):
    """kvxfer's common base of NIXL's exception types (NIXL has none: catch
    the named types)."""


class nixlNotPostedError(_NixlError):
    pass


class nixlInvalidParamError(_NixlError):
    pass


class nixlBackendError(_NixlError):
    pass


class nixlNotFoundError(_NixlError):
    pass


class nixlMismatchError(_NixlError):
    pass


class nixlNotAllowedError(_NixlError):
    pass


class nixlRepostActiveError(_NixlError):
    pass


class nixlUnknownError(_NixlError):
    pass


class nixlNotSupportedError(_NixlError):
    pass


class nixlRemoteDisconnectError(_NixlError):
    pass


class nixlCancelledError(_NixlError):
    pass


class nixlNoTelemetryError(_NixlError):
    pass


class nixlXferTelemetry:
    """One transfer's telemetry (nixl_agent.get_xfer_telemetry): times in
    microseconds. startTime is when the last post began (CLOCK_MONOTONIC,
    time.monotonic_ns() // 1000); postDuration how long the post call took;
    xferDuration from the post's start until the transfer was seen done (0
    while it is not); totalBytes and descCount the transfer's bytes and
    descriptors (a prepared transfer counts a pair adjacent to the previous
    one on both sides as part of it, as NIXL merges them)."""

    __slots__ = ("_start", "_post", "_xfer", "_bytes", "_descs")

    def __init__(
        self,
        startTime: int = 0,
        postDuration: int = 0,
        xferDuration: int = 0,
        totalBytes: int = 0,
        descCount: int = 0,
    ) -> None:
        self._start = startTime
        self._post = postDuration
        self._xfer = xferDuration
        self._bytes = totalBytes
        self._descs = descCount

    startTime = property(lambda self: self._start)
    postDuration = property(lambda self: self._post)
    xferDuration = property(lambda self: self._xfer)
    totalBytes = property(lambda self: self._bytes)
    descCount = property(lambda self: self._descs)

    def __repr__(self) -> str:
        return (
            f"nixlXferTelemetry(startTime={self._start}, postDuration={self._post}, "
            f"xferDuration={self._xfer}, totalBytes={self._bytes}, descCount={self._descs})"
        )


def _rows_from_array(descs: np.ndarray) -> np.ndarray:
    if descs.ndim != 2 or descs.shape[1] != 3:
        raise ValueError(f"descs must be an Nx3 numpy array; got shape {descs.shape}")
    if descs.dtype not in (np.uint64, np.int64):
        raise ValueError(f"descs must be an Nx3 numpy array of uint64 or int64; got {descs.dtype}")
    if descs.dtype == np.int64 and descs.size and int(descs.min()) < 0:
        raise ValueError("descs holds a negative address, length or device")
    return np.ascontiguousarray(descs, dtype=np.uint64).copy()


class _DescList:
    """A NIXL descriptor list: (addr, len, dev) rows of one memory type, kept
    as an Nx3 uint64 array (what kvxfer's Transport.prepare reads)."""

    _width = 3

    def __init__(self, type: Union[nixl_mem_t, int], descs: Any = 0) -> None:
        self._type = nixl_mem_t(type)
        self._meta: list[bytes] = []
        if isinstance(descs, np.ndarray):
            self._rows = _rows_from_array(descs)
            self._meta = [b""] * len(self._rows)
        elif isinstance(descs, (list, tuple)):
            rows = [self._split(i, d) for i, d in enumerate(descs)]
            self._rows = np.array([r[0] for r in rows], dtype=np.uint64).reshape(-1, 3)
            self._meta = [r[1] for r in rows]
        else:
            count = int(descs)
            self._rows = np.zeros((count, 3), dtype=np.uint64)
            self._meta = [b""] * count

    def _split(self, i: int, desc: Any) -> tuple[tuple[int, int, int], bytes]:
        if not isinstance(desc, tuple):
            raise TypeError("Each descriptor must be a tuple when provided as a list")
        if len(desc) != self._width:
            raise ValueError(f"Each descriptor tuple must have exactly {self._width} elements")
        addr, length, dev = (int(v) for v in desc[:3])
        if min(addr, length, dev) < 0:
            raise ValueError(f"descriptor {i} holds a negative value: {desc!r}")
        meta = desc[3] if self._width == 4 else b""
        return (addr, length, dev), meta.encode() if isinstance(meta, str) else bytes(meta)

    def getType(self) -> nixl_mem_t:
        return self._type

    def descCount(self) -> int:
        return len(self._rows)

    def isEmpty(self) -> bool:
        return len(self._rows) == 0

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> tuple:
        addr, length, dev = (int(v) for v in self._rows[i])
        if self._width == 4:
            return (addr, length, dev, self._meta[i])
        return (addr, length, dev)

    def __setitem__(self, i: int, desc: tuple) -> None:
        row, meta = self._split(i, desc)
        self._rows[i] = row
        self._meta[i] = meta

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is type(self)
            and self._type == other._type  # type: ignore[attr-defined]
            and np.array_equal(self._rows, other._rows)  # type: ignore[attr-defined]
            and self._meta == other._meta  # type: ignore[attr-defined]
        )

    __hash__ = None  # type: ignore[assignment]

    def addDesc(self, desc: tuple) -> None:
        row, meta = self._split(len(self._rows), desc)
        self._rows = np.vstack([self._rows, np.array([row], dtype=np.uint64)])
        self._meta.append(meta)

    append = addDesc

    def index(self, desc: tuple) -> int:
        row, meta = self._split(0, desc)
        for i in range(len(self._rows)):
            if tuple(int(v) for v in self._rows[i]) == row and self._meta[i] == meta:
                return i
        raise nixlNotFoundError("NIXL_ERR_NOT_FOUND")

    def remDesc(self, i: int) -> None:
        self._rows = np.delete(self._rows, i, axis=0)
        del self._meta[i]

    def clear(self) -> None:
        self._rows = np.zeros((0, 3), dtype=np.uint64)
        self._meta = []

    def trim(self) -> None:
        pass

    def print(self) -> None:
        print(repr(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._type.name}, {len(self._rows)} descriptors)"


class nixlXferDList(_DescList):
    """A transfer descriptor list: (addr, len, dev) tuples."""

    _width = 3


class nixlRegDList(_DescList):
    """A registration descriptor list: (addr, len, dev, meta) tuples (an Nx3
    array gives empty meta)."""

    _width = 4



__all__ = [
    "DEFAULT_COMM_PORT",
    "NIXL_INIT_AGENT",
    "nixlBackendError",
    "nixlCancelledError",
    "nixlInvalidParamError",
    "nixlMismatchError",
    "nixlNoTelemetryError",
    "nixlNotAllowedError",
    "nixlNotFoundError",
    "nixlNotPostedError",
    "nixlNotSupportedError",
    "nixlRegDList",
    "nixlRemoteDisconnectError",
    "nixlRepostActiveError",
    "nixlUnknownError",
    "nixlXferDList",
    "nixlXferTelemetry",
    "nixl_cost_t",
    "nixl_mem_t",
    "nixl_status_t",
    "nixl_thread_sync_t",
    "nixl_xfer_op_t",
    *_ENUM_VALUES,
]
