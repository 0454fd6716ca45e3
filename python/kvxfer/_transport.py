# SPDX-License-Identifier: Apache-2.0
"""kvxfer.Transport: the reference NixlTransport's interface over the C++ core.

The hot calls (write_blocks, poll, cancel) of Transport are the C++ methods
themselves; the class adds only what is Python by nature: keyword options and
their checks, the concurrent.futures.Future of add_remote_peer_async, and the
context manager. NixlTransport, the drop-in, wraps the calls where the
reference answers where Transport raises (see python/README.md).
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import numbers
import operator
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Iterable, Mapping, NamedTuple, Optional, Sequence

from . import _kvxfer

_logger = logging.getLogger("kvxfer")


class PollResult(NamedTuple):
    """Transfer ids a poll() found done or failed, and the polled peer's fault.

    ``peer_fault`` is set on a scoped poll once that peer is faulted; the
    first cause sticks until the peer is removed. kvxfer.Transport returns
    ``done`` and ``failed`` as tuples; the drop-in kvxfer.NixlTransport, like
    the reference, as lists (the same class either way).
    """

    done: Sequence[int]
    failed: Sequence[int]
    peer_fault: Optional[str] = None


# Every empty poll returns this one value.
_EMPTY_POLL_RESULT = PollResult(done=(), failed=())
_kvxfer._set_poll_result(PollResult, _EMPTY_POLL_RESULT)

_OPTION_DEFAULTS: dict[str, Any] = {
    "progress_thread": True,
    "strike_limit": 3,
    "stall_timeout": 30.0,
    "engine_config": None,
    "latency_sample_every": 16,
    "telemetry": False,
    "telemetry_capacity": 4096,
}

# Transports not yet closed, closed at interpreter exit while the log bridge
# and the interpreter still work (see _close_all).
_open_transports: "weakref.WeakSet[Transport]" = weakref.WeakSet()


# The C++ options are ints: larger values cannot be handed over.
_INT_MAX = 2**31 - 1


def _int_option(name: str, value: Any, minimum: int) -> int:
    """An integer option, checked before C++ converts it (which would raise a
    TypeError that names no option, or wrap)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {value!r} ({type(value).__name__})")
    number = operator.index(value)
    if not minimum <= number <= _INT_MAX:
        raise ValueError(f"{name} must be from {minimum} to {_INT_MAX}; got {number}")
    return number


def _seconds_option(name: str, value: Any, maximum: float) -> float:
    """A duration in seconds: finite, from 0 to maximum."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds; got {value!r} ({type(value).__name__})"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int too big for a float
        raise ValueError(f"{name} is too large: {value!r} seconds") from None
    if not math.isfinite(seconds) or not 0.0 <= seconds <= maximum:
        raise ValueError(
            f"{name} must be a finite number of seconds from 0 (off) to {maximum:.0f} "
            f"(a year); got {value!r}"
        )
    return seconds


def _telemetry_capacity(telemetry: bool, value: Any) -> int:
    """telemetry_capacity: an int, and (as in C++, only when telemetry is on:
    off, no ring is made and the value is not used) 1 to
    kMaxTelemetryCapacity records."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"telemetry_capacity must be an int; got {value!r} ({type(value).__name__})"
        )
    if not telemetry:
        return _OPTION_DEFAULTS["telemetry_capacity"]
    capacity = operator.index(value)
    maximum = _kvxfer._MAX_TELEMETRY_CAPACITY
    if not 1 <= capacity <= maximum:
        raise ValueError(f"telemetry_capacity must be from 1 to {maximum}; got {capacity}")
    return capacity


def _bool_option(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False; got {value!r} ({type(value).__name__})")
    return value


def _config_json(fields: Optional[Mapping[str, Any]]) -> str:
    """The fields as the reference hashes them:
    json.dumps(fields, sort_keys=True, separators=(",", ":")); "" for none."""
    if fields is None:
        return ""
    if not isinstance(fields, Mapping):
        raise TypeError(
            f"config_fields must be a dict; got {fields!r} ({type(fields).__name__})"
        )
    if not fields:
        return ""
    try:
        return json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"config_fields must be JSON-serialisable: {exc}") from exc


def config_fingerprint(fields: Optional[Mapping[str, Any]]) -> str:
    """The reference's fingerprint of config_fields: the first 16 hex chars of
    sha256(json.dumps(fields, sort_keys=True, separators=(",", ":"))); "" for
    no fields. Values may be anything json.dumps takes."""
    return _kvxfer._config_fingerprint_json(_config_json(fields))


def _string_map(name: str, fields: Optional[Mapping[str, str]]) -> dict[str, str]:
    if fields is None:
        return {}
    if not isinstance(fields, Mapping):
        raise TypeError(f"{name} must be a dict; got {fields!r} ({type(fields).__name__})")
    out = dict(fields)
    for key, value in out.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"{name} must map str to str; got {key!r}: {value!r} "
                f"({type(key).__name__}: {type(value).__name__})"
            )
    return out


class TransferRecord(NamedTuple):
    """One finished transfer (kvxfer.Transport.telemetry())."""

    id: int
    peer: str
    op: str  # "write", "read" or "notify"
    blocks: int  # 0 for a transfer between descriptor lists (Transport.transfer)
    bytes: int
    posted: float  # time.monotonic() seconds: when the posting call began
    completed: float  # when the call that finished it began (poll, cancel...)
    result: str  # "done", "failed" or "cancelled"
    lane: str  # the engine's lane ("ucx", "cma"), "" when it has none


class Telemetry(NamedTuple):
    records: list
    dropped: int


class _RegistrationWaiter:
    """Resolves the Futures of add_remote_peer_async from the C++ futures.

    One thread per transport, waiting (GIL released) on each registration in
    submission order, which is the order the C++ registration worker
    finishes them in.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name="kvxfer-registrations", daemon=True
        )
        self._thread.start()

    def submit(self, pending: Any) -> Future:
        future: Future = Future()
        self._queue.put((pending, future))
        return future

    def stop(self, join: bool) -> None:
        self._queue.put(None)
        if join and threading.current_thread() is not self._thread:
            self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            pending, future = item
            if future.set_running_or_notify_cancel():
                _settle(future, pending)


def _settle(future: Future, pending: Any) -> None:
    """Waits for a C++ registration and hands its outcome to *future*."""
    try:
        pending.result()
    except BaseException as exc:  # noqa: BLE001 - handed to the caller
        future.set_exception(exc)
    else:
        future.set_result(None)


def _failed_future(exc: BaseException) -> Future:
    future: Future = Future()
    future.set_running_or_notify_cancel()
    future.set_exception(exc)
    return future


class Transport(_kvxfer.Transport):
    """Moves fixed-size KV blocks into peers' pools with one-sided WRITEs.

    ``view`` is the local pool: a 2-D, C-contiguous, writable buffer of
    bytes (num_blocks, block_len), e.g. a memoryview of a uint8 numpy array;
    None for a transport with no pool, which moves bytes between regions
    only (register_memory, prepare, transfer: the path kvxfer.nixl takes).
    The transport keeps the buffer exported (alive, not resizable) while it
    exists.

    ``config_fields``: settings both sides must agree on, any
    JSON-serialisable values; only their fingerprint travels (see
    kvxfer.config_fingerprint).

    Options: ``progress_thread`` (UCX progress thread, default True),
    ``strike_limit`` (consecutive transfer failures that fault a peer,
    default 3), ``stall_timeout`` (seconds a transfer may stay in progress
    before its peer is faulted as stalled, default 30.0, 0 disables) and
    ``engine_config`` (engine settings, e.g.
    ``{"TLS": "sm,self"}`` for UCX) and ``latency_sample_every`` (the
    metrics' latency histograms time one call and transfer in this many,
    default 16; 1 times every one), ``telemetry`` (keep a record of every
    finished transfer for ``telemetry()``, default False) and
    ``telemetry_capacity`` (records kept between ``telemetry()`` calls,
    default 4096; past that the oldest are dropped and counted). A bad value raises ValueError (TypeError
    for a wrong type) naming the option.

    This class is strict: caller mistakes raise. ``kvxfer.NixlTransport`` is
    the drop-in that answers like the reference instead.
    """

    def __init__(
        self,
        agent_name: str,
        view: Any,
        config_fields: Optional[Mapping[str, Any]] = None,
        backends: Optional[Sequence[str]] = None,
        num_threads: int = 4,
        **options: Any,
    ) -> None:
        unknown = sorted(options.keys() - _OPTION_DEFAULTS.keys())
        if unknown:
            raise TypeError(
                f"{type(self).__name__}() got unexpected keyword argument(s): "
                f"{', '.join(unknown)} (options: {', '.join(_OPTION_DEFAULTS)})"
            )
        opts = {**_OPTION_DEFAULTS, **options}
        telemetry = _bool_option("telemetry", opts["telemetry"])
        if isinstance(backends, str):
            raise TypeError(f"backends must be a list of names; got {backends!r}")
        super().__init__(
            agent_name,
            view,
            config_json=_config_json(config_fields),
            backends=list(backends) if backends else ["UCX"],
            num_threads=_int_option("num_threads", num_threads, 1),
            progress_thread=_bool_option("progress_thread", opts["progress_thread"]),
            strike_limit=_int_option("strike_limit", opts["strike_limit"], 1),
            stall_timeout=_seconds_option(
                "stall_timeout", opts["stall_timeout"], _kvxfer._MAX_STALL_TIMEOUT_S
            ),
            engine_config=_string_map("engine_config", opts["engine_config"]),
            latency_sample_every=_int_option(
                "latency_sample_every", opts["latency_sample_every"], 1
            ),
            telemetry=telemetry,
            telemetry_capacity=_telemetry_capacity(telemetry, opts["telemetry_capacity"]),
        )
        self._waiter: Optional[_RegistrationWaiter] = None
        self._waiter_lock = threading.Lock()
        self._closed = False
        _open_transports.add(self)

    def add_remote_peer_async(
        self,
        peer_id: str,
        agent_metadata: bytes,
        base_addr: int,
        num_blocks: int,
        block_len: int,
    ) -> Future:
        """Registers a peer on the registration worker.

        The Future fails with a RuntimeError (kvxfer.SupersededError) naming
        the peer if it is removed or registered again before this finishes,
        and with the ValueError of bad metadata or geometry. Raises
        RuntimeError at once after close().
        """
        try:
            pending = self._add_remote_peer_async(
                peer_id, agent_metadata, base_addr, num_blocks, block_len
            )
        except ValueError as exc:
            # The reference reports a bad registration through its Future.
            return _failed_future(exc)
        with self._waiter_lock:
            if not self._closed:
                if self._waiter is None:
                    self._waiter = _RegistrationWaiter()
                    weakref.finalize(self, self._waiter.stop, False)
                return self._waiter.submit(pending)
        # Closed meanwhile: close() has already failed the registration.
        future: Future = Future()
        future.set_running_or_notify_cancel()
        _settle(future, pending)
        return future

    def telemetry(self) -> "Telemetry":
        """The transfers that finished since the last call, oldest first, as
        ``Telemetry(records=[TransferRecord, ...], dropped=n)``: ``dropped``
        counts the records a full ring lost meanwhile. Empty unless the
        transport was made with ``telemetry=True``. Times are
        ``time.monotonic()`` seconds."""
        records, dropped = self._telemetry()
        return Telemetry([TransferRecord(*r) for r in records], dropped)

    def close(self) -> None:
        """Releases every transfer, peer and registration. Idempotent."""
        super().close()
        with self._waiter_lock:
            self._closed = True
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.stop(join=True)
        _open_transports.discard(self)

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if "_closed" not in self.__dict__:
            # __init__ raised (a bad option): there is no C++ transport to
            # ask, and asking would crash. Tracebacks repr such objects.
            return f"<kvxfer.{type(self).__name__} (not constructed)>"
        state = "open" if self.available else "closed"
        return (
            f"<kvxfer.{type(self).__name__} {self.agent_name!r} {self.backend} "
            f"{self.num_blocks}x{self.block_len} {state}>"
        )


_native_write_blocks = _kvxfer.Transport.write_blocks
_native_poll = _kvxfer.Transport.poll
_native_cancel = _kvxfer.Transport.cancel
_native_remove_remote_peer = _kvxfer.Transport.remove_remote_peer


def _notify_fits(notify: Any) -> bool:
    """Whether write_blocks' notify is None or 1..4096 bytes (a value of the
    wrong type raised TypeError before any ValueError could)."""
    if notify is None:
        return True
    try:
        size = memoryview(notify).nbytes
    except TypeError:
        return True
    return 1 <= size <= _kvxfer._MAX_NOTIFICATION_BYTES


def _could_be_an_id(value: Any) -> bool:
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        and 0 <= value < 2**63
    )


# Like the reference, every empty poll of the drop-in returns this one value:
# do not change its lists.
_EMPTY_REFERENCE_POLL_RESULT = PollResult(done=[], failed=[])


class NixlTransport(Transport):
    """The drop-in for vLLM's NixlTransport: Transport, answering like the
    reference wherever Transport is deliberately stricter.

    - add_remote_peer returns quietly when a concurrent remove or
      re-registration supersedes it (the async Future still fails).
    - write_blocks never raises for the indices' values: lists of different
      lengths, an empty write, an index outside either pool or a remote block
      named twice make the post fail, which is logged, counted against the
      peer as a failed post (one strike), and answered with None. An unknown
      peer is None without a strike. What the reference's numpy conversion
      refuses before its post still raises: entries that are not integers
      (TypeError), an index beyond 64 bits (OverflowError), an index list
      that is not a sequence (a dict, a set: TypeError). So does a bad
      notify (kvxfer's own argument: ValueError, no strike).
    - poll returns kvxfer.PollResult with done/failed as lists; after
      close() it is empty.
    - write_blocks after close() returns None, cancel returns [],
      remove_remote_peer does nothing.
    - cancel treats any mode other than "immediate" as "wait", and skips ids
      that are not ints (it never issued them).

    python/README.md lists every difference that remains.
    """

    def add_remote_peer(
        self,
        peer_id: str,
        agent_metadata: bytes,
        base_addr: int,
        num_blocks: int,
        block_len: int,
    ) -> None:
        try:
            super().add_remote_peer(peer_id, agent_metadata, base_addr, num_blocks, block_len)
        except _kvxfer.SupersededError:
            # The reference's synchronous registration ignores a lost race:
            # the peer was removed or registered again meanwhile, so nothing
            # is published (the core logged it), and it returns.
            return

    def write_blocks(
        self, peer_id: str, local_idxs: Any, remote_idxs: Any, notify: Any = None
    ) -> Optional[int]:
        try:
            return _native_write_blocks(self, peer_id, local_idxs, remote_idxs, notify)
        except ValueError as exc:
            if not _notify_fits(notify):
                # notify is kvxfer's own argument (the reference has none):
                # a bad one is the caller's mistake, not the peer's.
                raise
            # The reference hands any indices to NIXL, whose post then fails.
            # (An index beyond 64 bits raises OverflowError, as the
            # reference's numpy conversion does, before any post.)
            cause = f"invalid indices: {exc}"
        except RuntimeError:
            if self.available:
                raise
            return None  # closed: the reference has no peers left to write to
        try:
            if self._record_post_failure(peer_id, cause):
                return None
        except RuntimeError:
            if self.available:
                raise
            return None
        _logger.warning(
            "kvxfer %s: write_blocks to unknown peer=%s (known peers: %s)",
            self.agent_name,
            peer_id,
            self.peers(),
        )
        return None

    def poll(self, peer_id: Optional[str] = None) -> PollResult:
        try:
            result = _native_poll(self, peer_id)
        except RuntimeError:
            if self.available:
                raise
            return _EMPTY_REFERENCE_POLL_RESULT
        if result is _EMPTY_POLL_RESULT:
            return _EMPTY_REFERENCE_POLL_RESULT
        return PollResult(list(result.done), list(result.failed), result.peer_fault)

    def cancel(self, transfer_ids: Iterable[int], mode: str = "immediate") -> list[int]:
        # The reference tests for "immediate" and takes anything else as "wait".
        native_mode = "immediate" if mode == "immediate" else "wait"
        if not isinstance(transfer_ids, (list, tuple)):
            transfer_ids = list(transfer_ids)  # read twice if it is not all ids
        try:
            try:
                return _native_cancel(self, transfer_ids, native_mode)
            except (TypeError, ValueError, OverflowError):
                # The reference looks each id up and skips what it never
                # issued: anything but an int64 it could have issued.
                ids = [t for t in transfer_ids if _could_be_an_id(t)]
                return _native_cancel(self, ids, native_mode)
        except RuntimeError:
            if self.available:
                raise
            return []

    def remove_remote_peer(self, peer_id: str) -> None:
        if not self.available:
            return  # close() removed every peer already
        try:
            _native_remove_remote_peer(self, peer_id)
        except RuntimeError:
            if self.available:
                raise


@atexit.register
def _close_all() -> None:
    # Runs before the log bridge detaches (atexit is last-in, first-out), so
    # what closing logs still reaches logging, and no engine or registration
    # thread is left running while the interpreter finalizes.
    for transport in list(_open_transports):
        try:
            transport.close()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
