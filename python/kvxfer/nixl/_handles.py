# SPDX-License-Identifier: Apache-2.0
"""kvxfer.nixl's agent configuration, what its agent keeps per transfer and
per prepared list (the handles NIXL hands out), and the conversions of
NIXL's arguments."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Optional, Union

import numpy as np

from ._bindings import (
    NIXL_INIT_AGENT,
    nixl_mem_t,
    nixl_thread_sync_t,
    nixlInvalidParamError,
    nixlNotSupportedError,
    nixlRegDList,
    nixlXferDList,
)

logger = logging.getLogger("kvxfer.nixl")

# The one plugin: kvxfer's engine behind backend "UCX" (its lanes: cma, ucx,
# tcp, as KVXFER_LANES orders them).
_PLUGIN = "UCX"
# NIXL's other plugins: asking for them is "not supported" here, where real
# NIXL would have them; any other name is "not found", as in NIXL.
_OTHER_PLUGINS = frozenset(
    {"GDS", "GDS_MT", "POSIX", "OBJ", "UCCL", "LIBFABRIC", "MOONCAKE", "HF3FS", "GPUNETIO",
     "AZURE_BLOB", "GUSLI", "UCX_MO"}
)
_MEM_TYPES = {
    "DRAM": nixl_mem_t.DRAM_SEG,
    "VRAM": nixl_mem_t.VRAM_SEG,
    "FILE": nixl_mem_t.FILE_SEG,
    "BLOCK": nixl_mem_t.BLK_SEG,
    "OBJ": nixl_mem_t.OBJ_SEG,
    "cpu": nixl_mem_t.DRAM_SEG,
    "cuda": nixl_mem_t.VRAM_SEG,
}
_OPS = {"WRITE": "WRITE", "READ": "READ"}
_LOCAL_NAMES = ("NIXL_INIT_AGENT", NIXL_INIT_AGENT)
_TRUTHY = ("y", "yes", "1", "true", "on")


def _telemetry_env() -> bool:
    return os.environ.get("NIXL_TELEMETRY_ENABLE", "").strip().lower() in _TRUTHY


def _agent_name(name: Union[str, bytes]) -> str:
    """An agent name as NIXL takes it: str, or the bytes add_remote_agent returns."""
    if isinstance(name, bytes):
        return name.decode("utf-8", "surrogateescape")
    if isinstance(name, str):
        return name
    raise nixlInvalidParamError(f"an agent name must be str or bytes; got {name!r}")


def _message(msg: Union[bytes, str, None]) -> Optional[bytes]:
    """A notification as the core takes it: None for none."""
    if msg is None:
        return None
    data = msg.encode() if isinstance(msg, str) else bytes(msg)
    return data or None


def _dram_only(mem: nixl_mem_t) -> None:
    if mem != nixl_mem_t.DRAM_SEG:
        raise nixlNotSupportedError(
            f"kvxfer moves host memory only: memory type {mem.name} is not supported "
            "(register and transfer DRAM; GPU memory needs real NIXL)"
        )


def _now_ns() -> int:
    return time.monotonic_ns()


def _ceil_us(ns: int) -> int:
    return -(-ns // 1000)


class nixl_agent_config:
    """NIXL's agent configuration. Every NIXL field is accepted; kvxfer uses
    ``backends`` ("UCX" or none), ``num_threads`` (its engine threads when
    > 0), ``enable_prog_thread`` (its progress thread) and
    ``capture_telemetry``. ``enable_listen_thread``/``listen_port`` are kept
    but start nothing: metadata travels out of band (get_agent_metadata,
    add_remote_agent). ``sync_mode`` changes nothing: an agent is always
    thread-safe.

    ``kvxfer_options`` (kvxfer's own, not NIXL's): keyword arguments for the
    kvxfer.Transport behind the agent, e.g. ``{"backends": ["LOOPBACK"]}``
    for in-process tests, ``{"engine_config": {...}}``, ``{"stall_timeout":
    30.0}`` (default 0: off, as NIXL has no stall rule).
    """

    def __init__(
        self,
        enable_prog_thread: bool = True,
        enable_listen_thread: bool = False,
        listen_port: int = 0,
        capture_telemetry: bool = False,
        num_threads: int = 0,
        backends: Optional[list[str]] = None,
        sync_mode: Optional[nixl_thread_sync_t] = None,
        *,
        kvxfer_options: Optional[dict[str, Any]] = None,
    ) -> None:
        self.backends = list(backends) if backends is not None else [_PLUGIN]
        self.enable_pthread = bool(enable_prog_thread)
        self.enable_listen = bool(enable_listen_thread)
        self.port = int(listen_port)
        self.capture_telemetry = bool(capture_telemetry)
        self.num_threads = int(num_threads)
        self.sync_mode = sync_mode
        self.kvxfer_options = dict(kvxfer_options or {})


class _XferState:
    """What the agent keeps of one transfer handle (never the handle itself,
    so a dropped handle can be collected while its transfer is in flight)."""

    __slots__ = (
        "op", "peer", "local", "local_idx", "remote", "remote_idx", "notif", "descs", "bytes",
        "state", "tid", "outcome", "released", "start_ns", "post_ns", "done_ns",
    )

    def __init__(self, op: str, peer: str, local: Any, local_idx: Any, remote: Any,
                 remote_idx: Any, notif: Optional[bytes], descs: int, nbytes: int) -> None:
        self.op = op
        self.peer = peer
        self.local = local
        self.local_idx = local_idx
        self.remote = remote
        self.remote_idx = remote_idx
        self.notif = notif
        self.descs = descs
        self.bytes = nbytes
        self.state = "INIT"  # INIT, PROC, DONE, ERR
        self.tid: Optional[int] = None
        self.outcome: Optional[BaseException | str] = None
        self.released = False
        self.start_ns = 0
        self.post_ns = 0
        self.done_ns = 0


class nixl_xfer_handle:
    """A transfer request (make_prepped_xfer, initialize_xfer). ``release()``
    frees it, cancelling a transfer in progress; so does garbage collection."""

    __slots__ = ("_agent", "_state", "__weakref__")

    def __init__(self, agent: Any, state: _XferState) -> None:
        self._agent = agent
        self._state = state

    def release(self) -> None:
        self._agent._release_xfer(self._state, blocking=True)

    def __del__(self) -> None:
        try:
            self._agent._release_xfer(self._state, blocking=False)
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self) -> str:
        s = self._state
        return f"nixl_xfer_handle({s.op} {s.peer!r}, {s.state}, released={s.released})"


class nixl_prepped_dlist_handle:
    """A prepared descriptor list (prep_xfer_dlist): a kvxfer DescList, local
    or checked against one peer's regions."""

    __slots__ = ("_agent", "_list", "_peer", "_rows", "_released")

    def __init__(self, agent: Any, dlist: Any, peer: str, rows: np.ndarray) -> None:
        self._agent = agent
        self._list = dlist
        self._peer = peer  # "" for a local list
        self._rows = rows
        self._released = False

    def release(self) -> None:
        self._released = True
        self._list = None

    def __repr__(self) -> str:
        where = f"for {self._peer!r}" if self._peer else "local"
        return f"nixl_prepped_dlist_handle({len(self._rows)} descriptors {where}, released={self._released})"


def _indices(values: Any, name: str, size: int) -> np.ndarray:
    """An index list as a fresh int64 array, every index inside the list."""
    try:
        idx = np.array(values, dtype=np.int64, copy=True).reshape(-1)
    except (TypeError, ValueError, OverflowError) as exc:
        raise nixlInvalidParamError(f"{name} must be a list or 1-D array of ints: {exc}") from exc
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= size):
        bad = int(idx[(idx < 0) | (idx >= size)][0])
        raise nixlInvalidParamError(f"{name}: index {bad} is outside the prepared list of {size}")
    return idx


def _tensor_rows(descs: Any) -> Optional[tuple[Optional[nixl_mem_t], list[tuple[int, int, int]]]]:
    """(memory type, rows) for a torch tensor or a list of them; None for
    anything else. A type of None: refused (logged), as NIXL does."""
    items = descs if isinstance(descs, (list, tuple)) and descs else [descs]
    if not all(type(t).__module__.startswith("torch") and hasattr(t, "data_ptr") for t in items):
        return None
    rows = []
    devices = {str(t.device).split(":")[0] for t in items}
    if len(devices) != 1 or not all(t.is_contiguous() for t in items):
        logger.error("kvxfer.nixl: tensors must be contiguous and on one kind of device")
        return None, []
    for t in items:
        dev = t.get_device()
        rows.append((int(t.data_ptr()), int(t.numel() * t.element_size()), max(dev, 0)))
    return _MEM_TYPES.get(devices.pop(), nixl_mem_t.VRAM_SEG), rows


def _desc_list(cls: type, width: int, descs: Any, mem_type: Optional[str]) -> Any:
    """NIXL's get_xfer_descs/get_reg_descs: a list of `cls`, or None (logged)
    for input NIXL refuses the same way; KeyError for an unknown memory type."""
    if isinstance(descs, cls):
        return descs
    if isinstance(descs, (nixlXferDList, nixlRegDList)):
        logger.error("kvxfer.nixl: a %s was given where a %s is needed",
                     type(descs).__name__, cls.__name__)
        return None
    tensors = _tensor_rows(descs)
    if tensors is not None:
        mem, rows = tensors
        if mem is None:
            return None
        if cls is nixlRegDList:
            return cls(mem, [(a, n, d, "") for a, n, d in rows])
        return cls(mem, np.array(rows, dtype=np.uint64).reshape(-1, 3))
    if mem_type is None:
        logger.error("kvxfer.nixl: give a memory type unless passing tensors")
        return None
    mem = _MEM_TYPES[mem_type]  # KeyError for an unknown type, as in NIXL
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            logger.error("kvxfer.nixl: an Nx3 array is needed; got shape %s", descs.shape)
            return None
        return cls(mem, descs)
    if isinstance(descs, (list, tuple)) and (not descs or isinstance(descs[0], tuple)):
        if descs and len(descs[0]) != width:
            logger.error("kvxfer.nixl: %d-tuples are needed", width)
            return None
        return cls(mem, list(descs))
    return None
