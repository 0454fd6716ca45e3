"""kvxfer.Transport: the reference NixlTransport's interface over the C++ core.

The hot calls (write_blocks, poll, cancel) are the C++ methods themselves;
this class adds only what is Python by nature: keyword options, the
concurrent.futures.Future of add_remote_peer_async, and the context manager.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from . import _kvxfer


class PollResult(NamedTuple):
    """Transfer ids a poll() found done or failed, and the polled peer's fault.

    ``peer_fault`` is set on a scoped poll once that peer is faulted; the
    first cause sticks until the peer is removed.
    """

    done: tuple[int, ...]
    failed: tuple[int, ...]
    peer_fault: Optional[str] = None


# Every empty poll returns this one value.
_EMPTY_POLL_RESULT = PollResult(done=(), failed=())
_kvxfer._set_poll_result(PollResult, _EMPTY_POLL_RESULT)

_OPTION_DEFAULTS: dict[str, Any] = {
    "progress_thread": True,
    "strike_limit": 3,
    "stall_timeout": 30.0,
    "engine_config": None,
}

# Transports not yet closed, closed at interpreter exit while the log bridge
# and the interpreter still work (see _close_all).
_open_transports: "weakref.WeakSet[Transport]" = weakref.WeakSet()


def _string_map(name: str, fields: Optional[Mapping[str, str]]) -> dict[str, str]:
    if fields is None:
        return {}
    out = dict(fields)
    for key, value in out.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"{name} must map str to str; got {key!r}: {value!r} "
                f"({type(key).__name__}: {type(value).__name__})"
            )
    return out


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
    bytes (num_blocks, block_len), e.g. a memoryview of a uint8 numpy array.
    The transport keeps the buffer exported (alive, not resizable) while it
    exists.

    Options: ``progress_thread`` (UCX progress thread, default True),
    ``strike_limit`` (consecutive transfer failures that fault a peer,
    default 3), ``stall_timeout`` (seconds a transfer may stay in progress
    before its peer is faulted as stalled, default 30.0, 0 disables) and
    ``engine_config`` (engine settings, e.g.
    ``{"TLS": "sm,self"}`` for UCX).
    """

    def __init__(
        self,
        agent_name: str,
        view: Any,
        config_fields: Optional[Mapping[str, str]] = None,
        backends: Optional[Sequence[str]] = None,
        num_threads: int = 4,
        **options: Any,
    ) -> None:
        unknown = sorted(options.keys() - _OPTION_DEFAULTS.keys())
        if unknown:
            raise TypeError(
                f"Transport() got unexpected keyword argument(s): {', '.join(unknown)} "
                f"(options: {', '.join(_OPTION_DEFAULTS)})"
            )
        opts = {**_OPTION_DEFAULTS, **options}
        super().__init__(
            agent_name,
            view,
            config_fields=_string_map("config_fields", config_fields),
            backends=list(backends) if backends else ["UCX"],
            num_threads=num_threads,
            progress_thread=bool(opts["progress_thread"]),
            strike_limit=opts["strike_limit"],
            stall_timeout=float(opts["stall_timeout"]),
            engine_config=_string_map("engine_config", opts["engine_config"]),
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
        state = "open" if self.available else "closed"
        return (
            f"<kvxfer.Transport {self.agent_name!r} {self.backend} "
            f"{self.num_blocks}x{self.block_len} {state}>"
        )


NixlTransport = Transport


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
