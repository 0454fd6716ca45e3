# SPDX-License-Identifier: Apache-2.0
"""NIXL's agent API (``nixl._api``) over one kvxfer Transport.

A ``nixl_agent`` is a kvxfer Transport with no pool: every registered
descriptor is a kvxfer region, every prepared list a kvxfer DescList, every
transfer handle a kvxfer transfer id it posts again on each ``transfer``.
Host memory ("DRAM") only; see docs/nixl.md for what works and what differs.

Threads: any number may share an agent (SGLang does). The agent's own
tables are guarded by one lock that is never held across a call into the
transport; completions that a poll of a peer reports are kept for the handle
that owns each id, so one thread's check never loses another's.
"""

from __future__ import annotations

import collections
import logging
import pickle
import threading
from typing import Any, Optional, Union

import numpy as np

from .. import _kvxfer
from .._transport import Transport
from . import _bindings as nixlBind
from ._bindings import (
    DEFAULT_COMM_PORT,
    nixl_thread_sync_t,
    nixlBackendError,
    nixlInvalidParamError,
    nixlNoTelemetryError,
    nixlNotFoundError,
    nixlNotPostedError,
    nixlNotSupportedError,
    nixlRegDList,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlXferDList,
    nixlXferTelemetry,
)

from ._handles import (
    _LOCAL_NAMES,
    _MEM_TYPES,
    _OPS,
    _OTHER_PLUGINS,
    _PLUGIN,
    _XferState,
    _agent_name,
    _ceil_us,
    _desc_list,
    _dram_only,
    _indices,
    _message,
    _now_ns,
    _telemetry_env,
    _tensor_rows,
    nixl_agent_config,
    nixl_prepped_dlist_handle,
    nixl_xfer_handle,
)

logger = logging.getLogger("kvxfer.nixl")

# NIXL's opaque backend handle type (never handed to its users).
nixl_backend_handle = int

__all__ = [
    "DEFAULT_COMM_PORT",
    "nixlBind",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]



class nixl_agent:
    """NIXL's agent over a kvxfer Transport with no pool (see the module's
    docstring and docs/nixl.md)."""

    def __init__(
        self,
        agent_name: str,
        nixl_conf: Optional[nixl_agent_config] = None,
        instantiate_all: bool = False,
    ) -> None:
        if not isinstance(agent_name, str) or not agent_name:
            raise ValueError(f"agent_name must be a non-empty str; got {agent_name!r}")
        conf = nixl_conf if nixl_conf is not None else nixl_agent_config()
        if conf.enable_listen:
            logger.warning(
                "kvxfer.nixl %s: enable_listen_thread starts no listener; exchange "
                "get_agent_metadata() out of band", agent_name)
        options: dict[str, Any] = {"stall_timeout": 0.0, "progress_thread": conf.enable_pthread}
        if conf.num_threads > 0:
            options["num_threads"] = conf.num_threads
        options.update(conf.kvxfer_options)
        self.name = agent_name
        self._transport = Transport(agent_name, None, **options)
        self._telemetry = conf.capture_telemetry or _telemetry_env()
        self._lock = threading.Lock()
        self._backends: dict[str, dict[str, str]] = {}
        self._regions: dict[tuple[int, int], int] = {}  # (addr, len) -> region id
        self._peers: set[str] = set()
        self._faults: dict[str, str] = {}
        self._inflight: dict[int, _XferState] = {}  # transfer id -> its handle's state
        self._posting = 0  # posts whose ids are not handed over yet
        self._unclaimed: dict[int, tuple[Any, int]] = {}  # what polls saw meanwhile
        self._doomed: collections.deque = collections.deque()  # collected while locked
        self.notifs: dict[str, list[bytes]] = {}
        self.plugin_list = [_PLUGIN]
        for backend in self.plugin_list if instantiate_all else conf.backends:
            if backend == _PLUGIN:
                self.create_backend(backend)
            else:
                logger.warning("kvxfer.nixl %s: skipping backend %s (kvxfer has UCX only)",
                               agent_name, backend)

    # ---- plugins and backends ----------------------------------------------

    def get_plugin_list(self) -> list[str]:
        return list(self.plugin_list)

    def get_plugin_mem_types(self, backend: str) -> list[str]:
        return ["DRAM"] if backend == _PLUGIN else []

    def get_plugin_params(self, backend: str) -> dict[str, str]:
        return {"num_threads": "0"} if backend == _PLUGIN else {}

    def get_backend_mem_types(self, backend: str) -> list[str]:
        return ["DRAM"] if backend in self._backends else []

    def get_backend_params(self, backend: str) -> dict[str, str]:
        return dict(self._backends.get(backend, {}))

    def create_backend(self, backend: str, initParams: Optional[dict[str, str]] = None) -> None:
        """"UCX" only: kvxfer's engine, made with the agent (its lanes follow
        KVXFER_LANES); init parameters are kept, not applied."""
        if backend != _PLUGIN:
            error = nixlNotSupportedError if backend in _OTHER_PLUGINS else nixlNotFoundError
            raise error(f"kvxfer.nixl: backend {backend!r} is not available; kvxfer provides UCX only")
        with self._lock:
            self._backends[backend] = {str(k): str(v) for k, v in (initParams or {}).items()}

    # ---- descriptor lists ----------------------------------------------------

    def get_xfer_descs(self, descs: Any, mem_type: Optional[str] = None,
                       is_sorted: bool = False) -> Optional[nixlXferDList]:
        return _desc_list(nixlXferDList, 3, descs, mem_type)

    def get_reg_descs(self, descs: Any, mem_type: Optional[str] = None,
                      is_sorted: bool = False) -> Optional[nixlRegDList]:
        return _desc_list(nixlRegDList, 4, descs, mem_type)

    def get_serialized_descs(self, descs: Any) -> bytes:
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs: bytes) -> Any:
        return pickle.loads(serialized_descs)

    # ---- memory ----------------------------------------------------------------

    def register_memory(self, reg_list: Any, mem_type: Optional[str] = None,
                        backends: Optional[list[str]] = None, is_sorted: bool = False) -> nixlRegDList:
        """Registers every descriptor as one kvxfer region (DRAM only)."""
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError(f"cannot make a registration list of {type(reg_list).__name__}")
        _dram_only(descs.getType())
        if not self._backends:
            raise nixlNotFoundError("no backend: create_backend(\"UCX\") first")
        done: list[tuple[int, int]] = []
        try:
            for addr, length, _dev in descs._rows.tolist():
                region = self._call(self._transport.register_memory, addr, length)
                with self._lock:
                    self._regions[(addr, length)] = region
                done.append((addr, length))
        except BaseException:
            self._deregister(done)
            raise
        return descs

    def deregister_memory(self, dereg_list: nixlRegDList, backends: Optional[list[str]] = None) -> None:
        if not isinstance(dereg_list, nixlRegDList):
            raise nixlInvalidParamError("deregister_memory takes the nixlRegDList register_memory returned")
        keys = [(a, n) for a, n, _d in dereg_list._rows.tolist()]
        with self._lock:
            missing = [k for k in keys if k not in self._regions]
        if missing:
            raise nixlNotFoundError(f"not registered: {missing[0][0]:#x} ({missing[0][1]} bytes)")
        self._deregister(keys)

    def _deregister(self, keys: list[tuple[int, int]]) -> None:
        for key in keys:
            with self._lock:
                region = self._regions.pop(key, None)
            if region is not None:
                self._call(self._transport.deregister_memory, region)

    def query_memory(self, reg_list: Any, backend: str, mem_type: Optional[str] = None) -> list:
        raise nixlNotSupportedError("kvxfer.nixl: query_memory is not supported")

    # ---- metadata and peers ------------------------------------------------

    def get_agent_metadata(self) -> bytes:
        """A snapshot: regions registered later are not in it."""
        return self._call(self._transport.get_agent_metadata)

    def add_remote_agent(self, metadata: bytes) -> bytes:
        """Registers the agent the metadata describes; returns its name (bytes,
        as NIXL). Adding a known agent again registers it anew: its
        transfers in progress report nixlRemoteDisconnectError, and lists
        prepared for it must be prepared again."""
        name = self._call(_kvxfer.metadata_agent_name, metadata)
        if name == self.name:
            raise nixlInvalidParamError("kvxfer.nixl: an agent cannot add itself")
        with self._lock:
            if name in self._peers:
                self._settle_peer(name, "was registered again")
        self._call(self._transport.add_remote_peer, name, metadata)
        with self._lock:
            self._peers.add(name)
            self._faults.pop(name, None)
        return name.encode("utf-8", "surrogateescape")

    def remove_remote_agent(self, agent: Union[str, bytes]) -> None:
        """Forgets the agent; its transfers still in progress report nixlRemoteDisconnectError."""
        name = _agent_name(agent)
        with self._lock:
            if name not in self._peers:
                raise nixlNotFoundError(f"agent {name!r} is not registered")
            self._peers.discard(name)
            self._faults.pop(name, None)
            self._settle_peer(name, "was removed")
        self._call(self._transport.remove_remote_peer, name)

    def _settle_peer(self, name: str, why: str) -> None:
        """Fails the agent's transfers in progress, whose ids the core is about
        to drop with its registration. Caller holds the lock."""
        for tid, state in list(self._inflight.items()):
            if state.peer == name:
                state.outcome = nixlRemoteDisconnectError(f"agent {name!r} {why}")
                del self._inflight[tid]

    def check_remote_metadata(self, agent: Union[str, bytes], descs: Any = None) -> bool:
        with self._lock:
            return _agent_name(agent) in self._peers

    def make_connection(self, remote_agent: Union[str, bytes], backends: Optional[list[str]] = None) -> None:
        """Connects at add_remote_agent already: only checks the agent is known."""
        if not self.check_remote_metadata(remote_agent):
            raise nixlNotFoundError(f"agent {_agent_name(remote_agent)!r} is not registered")

    def _no_listener(self, *args: Any, **kwargs: Any) -> None:
        raise nixlNotSupportedError(
            "kvxfer.nixl has no metadata listener or server: pass get_agent_metadata() to "
            "add_remote_agent() out of band")

    send_local_metadata = _no_listener
    send_partial_agent_metadata = _no_listener
    fetch_remote_metadata = _no_listener
    invalidate_local_metadata = _no_listener
    get_partial_agent_metadata = _no_listener

    # ---- prepared lists and transfers -----------------------------------------

    def prep_xfer_dlist(self, agent_name: Union[str, bytes], xfer_list: Any,
                        mem_type: Optional[str] = None, backends: Optional[list[str]] = None,
                        is_sorted: bool = False) -> nixl_prepped_dlist_handle:
        """A local list ("NIXL_INIT_AGENT" or "") or one checked against a
        peer's regions: a descriptor that lies in none of them (or straddles
        two) raises nixlNotFoundError."""
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError(f"cannot make a transfer list of {type(xfer_list).__name__}")
        _dram_only(descs.getType())
        peer = self._peer_of_list(agent_name)
        dlist = self._prepare(descs._rows, peer)
        return nixl_prepped_dlist_handle(self, dlist, peer, descs._rows)

    def _peer_of_list(self, agent_name: Union[str, bytes]) -> str:
        name = _agent_name(agent_name)
        if name in _LOCAL_NAMES:
            return ""
        if name == self.name:
            raise nixlNotSupportedError("kvxfer.nixl: transfers within one agent are not supported")
        with self._lock:
            if name not in self._peers:
                raise nixlNotFoundError(f"agent {name!r} is not registered (add_remote_agent)")
        return name

    def _prepare(self, rows: np.ndarray, peer: str) -> Any:
        try:
            return self._transport.prepare(rows, peer or None)
        except ValueError as exc:
            raise nixlNotFoundError(str(exc)) from exc
        except RuntimeError as exc:
            raise nixlBackendError(str(exc)) from exc

    def make_prepped_xfer(self, operation: str, local_xfer_side: nixl_prepped_dlist_handle,
                          local_indices: Any, remote_xfer_side: nixl_prepped_dlist_handle,
                          remote_indices: Any, notif_msg: Union[bytes, str] = b"",
                          backends: Optional[list[str]] = None,
                          skip_desc_merge: bool = False) -> nixl_xfer_handle:
        op = _OPS[operation]  # KeyError for another op, as in NIXL
        local, remote = local_xfer_side, remote_xfer_side
        for side, handle, is_remote in (("local", local, False), ("remote", remote, True)):
            if not isinstance(handle, nixl_prepped_dlist_handle) or handle._released:
                raise nixlInvalidParamError(f"{side}_xfer_side must be a live prep_xfer_dlist handle")
            if bool(handle._peer) != is_remote:
                raise nixlInvalidParamError(f"{side}_xfer_side was prepared as a "
                                            f"{'remote' if handle._peer else 'local'} list")
        lidx = _indices(local_indices, "local_indices", len(local._rows))
        ridx = _indices(remote_indices, "remote_indices", len(remote._rows))
        if len(lidx) != len(ridx) or len(lidx) == 0:
            raise nixlInvalidParamError(
                f"{len(lidx)} local and {len(ridx)} remote indices: both must be equal and non-zero")
        lrows, rrows = local._rows[lidx], remote._rows[ridx]
        bad = np.flatnonzero(lrows[:, 1] != rrows[:, 1])
        if bad.size:
            i = int(bad[0])
            raise nixlInvalidParamError(
                f"pair {i}: local descriptor {lidx[i]} has {lrows[i, 1]} bytes, remote "
                f"descriptor {ridx[i]} has {rrows[i, 1]}")
        descs = len(lidx)
        if not skip_desc_merge and descs > 1:
            joins = (lrows[1:, 0] == lrows[:-1, 0] + lrows[:-1, 1]) & (
                rrows[1:, 0] == rrows[:-1, 0] + rrows[:-1, 1])
            descs -= int(np.count_nonzero(joins))
        state = _XferState(op, remote._peer, local._list, lidx, remote._list, ridx,
                           _message(notif_msg), descs, int(lrows[:, 1].sum()))
        return nixl_xfer_handle(self, state)

    def initialize_xfer(self, operation: str, local_descs: nixlXferDList,
                        remote_descs: nixlXferDList, remote_agent: Union[str, bytes],
                        notif_msg: Union[bytes, str] = b"",
                        backends: Optional[list[str]] = None) -> nixl_xfer_handle:
        """Descriptor i with descriptor i, checked now; no merging (the
        telemetry's descriptor count is the list's length)."""
        op = _OPS[operation]
        for side, descs in (("local_descs", local_descs), ("remote_descs", remote_descs)):
            if not isinstance(descs, nixlXferDList):
                raise nixlInvalidParamError(f"{side} must be a nixlXferDList (get_xfer_descs)")
            _dram_only(descs.getType())
        peer = self._peer_of_list(remote_agent)
        if not peer:
            raise nixlInvalidParamError("initialize_xfer needs a remote agent's name")
        lrows, rrows = local_descs._rows, remote_descs._rows
        if len(lrows) != len(rrows) or len(lrows) == 0:
            raise nixlInvalidParamError(
                f"{len(lrows)} local and {len(rrows)} remote descriptors: both must be equal and non-zero")
        bad = np.flatnonzero(lrows[:, 1] != rrows[:, 1])
        if bad.size:
            i = int(bad[0])
            raise nixlInvalidParamError(
                f"descriptor {i} has {lrows[i, 1]} local bytes and {rrows[i, 1]} remote ones")
        state = _XferState(op, peer, self._prepare(lrows, ""), None, self._prepare(rrows, peer),
                           None, _message(notif_msg), len(lrows), int(lrows[:, 1].sum()))
        return nixl_xfer_handle(self, state)

    def transfer(self, handle: nixl_xfer_handle, notif_msg: Union[bytes, str] = b"") -> str:
        """Posts the transfer (again, once it is DONE or failed): "PROC"."""
        self._reap()
        state = self._state_of(handle)
        notif = _message(notif_msg) or state.notif
        with self._lock:
            if state.state == "PROC":
                raise nixlRepostActiveError("the transfer is still in progress")
            if state.peer not in self._peers:
                state.state = "ERR"
                raise nixlNotFoundError(f"agent {state.peer!r} is not registered")
            state.state, state.outcome, state.tid = "PROC", None, None
            self._posting += 1
        start = _now_ns()
        try:
            tid = self._transport.transfer(state.op, state.peer, state.local, state.local_idx,
                                           state.remote, state.remote_idx, notif)
        except BaseException as exc:
            self._posted(state, None)
            if isinstance(exc, (ValueError, TypeError)):
                raise nixlInvalidParamError(str(exc)) from exc
            if isinstance(exc, RuntimeError):
                raise nixlBackendError(str(exc)) from exc
            raise
        if tid is None:
            self._posted(state, None)
            self._poll(state.peer)
            raise self._post_error(state.peer)
        if self._posted(state, tid, start, _now_ns()):
            self._transport.cancel([tid])  # released while it was being posted
        return "PROC"

    def _posted(self, state: _XferState, tid: Optional[int], start: int = 0, posted: int = 0) -> bool:
        """Ends a post: hands the handle its id and what another thread's poll
        saw of it meanwhile (or ERR without an id). True when the handle was
        released meanwhile and the id must be cancelled."""
        with self._lock:
            self._posting -= 1
            early = self._unclaimed.pop(tid, None) if tid is not None else None
            if self._posting == 0:
                self._unclaimed.clear()  # ids no post can claim any more
            if tid is None:
                state.state = "ERR"
                return False
            state.tid, state.start_ns, state.post_ns, state.done_ns = tid, start, posted, 0
            if state.released:
                return True
            if early is not None:
                state.outcome = early[0]
                state.done_ns = early[1] if early[0] == "DONE" else 0
            elif state.peer not in self._peers:
                state.outcome = nixlRemoteDisconnectError(f"agent {state.peer!r} was removed")
            else:
                self._inflight[tid] = state
            return False

    def _post_error(self, peer: str) -> BaseException:
        with self._lock:
            fault = self._faults.get(peer)
        if fault is not None:
            return nixlRemoteDisconnectError(f"agent {peer!r} is faulted: {fault}")
        return nixlBackendError(f"the post to agent {peer!r} failed (see the kvxfer log)")

    def check_xfer_state(self, handle: nixl_xfer_handle) -> str:
        """"DONE" or "PROC"; a failed transfer raises (nixlRemoteDisconnectError
        when its agent is faulted or was removed, else nixlBackendError)."""
        self._reap()
        state = self._state_of(handle)
        if state.state == "INIT":
            raise nixlNotPostedError("the transfer was never posted")
        if state.state == "PROC" and state.outcome is None:
            self._poll(state.peer)
            dropped = None
            with self._lock:
                fault = self._faults.get(state.peer)
                if state.outcome is None and fault is not None and state.tid is not None:
                    # The core keeps a faulted peer's transfer in flight (its
                    # bytes may still land) until the peer is removed: NIXL's
                    # caller sees the disconnect now, and the id is dropped.
                    self._inflight.pop(state.tid, None)
                    state.outcome = nixlRemoteDisconnectError(f"agent {state.peer!r} is faulted: {fault}")
                    dropped = state.tid
            if dropped is not None:
                self._transport.cancel([dropped])
        with self._lock:
            outcome = state.outcome
            if state.state == "PROC" and outcome is not None:
                state.state = "DONE" if outcome == "DONE" else "ERR"
        if outcome is None:
            return "PROC"
        if outcome == "DONE":
            return "DONE"
        raise outcome  # type: ignore[misc]

    def _poll(self, peer: str) -> None:
        """Polls one peer (no lock held) and hands each finished id to its handle."""
        try:
            result = self._transport.poll(peer)
        except (ValueError, RuntimeError):
            return  # removed meanwhile: remove_remote_agent settled its handles
        now = _now_ns()
        with self._lock:
            if result.peer_fault is not None:
                self._faults[peer] = result.peer_fault
            fault = self._faults.get(peer)
            for tid in result.done:
                self._settle(tid, "DONE", now)
            for tid in result.failed:
                self._settle(tid, nixlRemoteDisconnectError(f"agent {peer!r} is faulted: {fault}")
                             if fault is not None
                             else nixlBackendError(f"the transfer to agent {peer!r} failed (see the kvxfer log)"),
                             now)

    def _settle(self, tid: int, outcome: Any, now: int) -> None:
        """Gives a finished id's outcome to its handle. Caller holds the lock."""
        state = self._inflight.pop(tid, None)
        if state is not None:
            state.outcome = outcome
            state.done_ns = now if outcome == "DONE" else 0
        elif self._posting:
            # Possibly a post's whose thread has not handed its id over yet.
            self._unclaimed[tid] = (outcome, now)

    def _state_of(self, handle: nixl_xfer_handle) -> _XferState:
        if not isinstance(handle, nixl_xfer_handle) or handle._agent is not self:
            raise nixlInvalidParamError("not a transfer handle of this agent")
        if handle._state.released:
            raise nixlInvalidParamError("the transfer handle was released")
        return handle._state

    def get_xfer_telemetry(self, handle: nixl_xfer_handle) -> nixlXferTelemetry:
        if not self._telemetry:
            raise nixlNoTelemetryError(
                "telemetry is off: nixl_agent_config(capture_telemetry=True) or NIXL_TELEMETRY_ENABLE=y")
        state = self._state_of(handle)
        with self._lock:
            start, posted, done = state.start_ns, state.post_ns, state.done_ns
        if start == 0:
            raise nixlNotPostedError("the transfer was never posted")
        return nixlXferTelemetry(
            startTime=start // 1000,
            postDuration=_ceil_us(posted - start),
            xferDuration=_ceil_us(done - start) if done else 0,
            totalBytes=state.bytes,
            descCount=state.descs,
        )

    def query_xfer_backend(self, handle: nixl_xfer_handle) -> str:
        self._state_of(handle)
        return _PLUGIN

    def estimate_xfer_cost(self, req_handle: nixl_xfer_handle) -> tuple:
        raise nixlNotSupportedError("kvxfer.nixl: estimate_xfer_cost is not supported")

    def release_xfer_handle(self, handle: nixl_xfer_handle) -> None:
        handle.release()

    def release_dlist_handle(self, handle: nixl_prepped_dlist_handle) -> None:
        handle.release()

    def _release_xfer(self, state: _XferState, blocking: bool) -> None:
        """Releases a handle's transfer, cancelling it if it is in flight. A
        finalizer (blocking False) that finds the lock taken, possibly by its
        own thread, leaves the work to the agent's next call."""
        if not self._lock.acquire(blocking=blocking):
            self._doomed.append(state)
            return
        try:
            if state.released:
                return
            state.released = True
            tid = state.tid if state.state == "PROC" and state.outcome is None else None
            if tid is not None:
                self._inflight.pop(tid, None)
        finally:
            self._lock.release()
        if tid is not None:
            try:
                self._transport.cancel([tid])
            except RuntimeError:
                pass  # closed: nothing is in flight any more

    def _reap(self) -> None:
        while self._doomed:
            try:
                state = self._doomed.popleft()
            except IndexError:
                return
            self._release_xfer(state, blocking=True)

    # ---- notifications -------------------------------------------------------

    def get_new_notifs(self, backends: Optional[list[str]] = None) -> dict[str, list[bytes]]:
        self._reap()
        return self._call(self._transport.get_notifications)

    def update_notifs(self, backends: Optional[list[str]] = None) -> dict[str, list[bytes]]:
        for agent, messages in self.get_new_notifs().items():
            self.notifs.setdefault(agent, []).extend(messages)
        return self.notifs

    def check_remote_xfer_done(self, remote_agent_name: str, lookup_tag: bytes,
                               backends: Optional[list[str]] = None, tag_is_prefix: bool = True) -> bool:
        messages = self.update_notifs().get(_agent_name(remote_agent_name), [])
        for i, msg in enumerate(messages):
            if (msg.startswith(lookup_tag) if tag_is_prefix else lookup_tag in msg):
                del messages[i]
                return True
        return False

    def send_notif(self, remote_agent_name: Union[str, bytes], notif_msg: Union[bytes, str],
                   backend: Optional[str] = None) -> None:
        name = _agent_name(remote_agent_name)
        with self._lock:
            if name not in self._peers:
                raise nixlNotFoundError(f"agent {name!r} is not registered")
        message = _message(notif_msg)
        if message is None:
            raise nixlInvalidParamError("a notification needs at least one byte")
        if self._call(self._transport.send_notification, name, message) is None:
            self._poll(name)
            raise self._post_error(name)

    # ---- helpers ---------------------------------------------------------------

    @staticmethod
    def _call(fn: Any, *args: Any) -> Any:
        """A transport call, its exceptions as NIXL's types."""
        try:
            return fn(*args)
        except (ValueError, TypeError, OverflowError) as exc:
            raise nixlInvalidParamError(str(exc)) from exc
        except RuntimeError as exc:
            raise nixlBackendError(str(exc)) from exc
