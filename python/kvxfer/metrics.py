# SPDX-License-Identifier: Apache-2.0
"""kvxfer.metrics: a transport's metrics on a prometheus_client registry.

    import prometheus_client
    import kvxfer.metrics

    t = kvxfer.Transport("engine-0", memoryview(pool))
    kvxfer.metrics.register(t)            # the default REGISTRY
    prometheus_client.start_http_server(9400)

Every scrape takes one Transport.metrics() snapshot and yields the same
families, names and labels as the C++ kvxfer::prometheus_text (see
docs/metrics.md). The collector holds the transport weakly: a transport that
is gone, or closed, yields nothing.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterator, Optional

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    UnknownMetricFamily,
)
from prometheus_client.registry import REGISTRY, CollectorRegistry

from . import _kvxfer

__all__ = ["TransportCollector", "register"]

_OPS = ("write", "read", "notify")

# name (without _total), the snapshot's field per op, help
_OP_COUNTERS = (
    ("kvxfer_transfers_done", "transfers_done", "Transfers poll() reported done."),
    ("kvxfer_transfers_failed", "transfers_failed", "Transfers poll() reported failed."),
    ("kvxfer_bytes_done", "bytes_done", "Block bytes of the transfers reported done."),
)
_PEER_OP_COUNTERS = (
    (
        "kvxfer_peer_transfers_done",
        "transfers_done",
        "Transfers to the peer's current registration reported done.",
    ),
    (
        "kvxfer_peer_transfers_failed",
        "transfers_failed",
        "Transfers to the peer's current registration reported failed.",
    ),
    (
        "kvxfer_peer_bytes_done",
        "bytes_done",
        "Block bytes of the peer's transfers reported done.",
    ),
)


def _name_part(name: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)


def _histogram(name: str, help_text: str, labels: list[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, help_text, labels=labels)


def _add_histogram(family: HistogramMetricFamily, values: list[str], h: dict) -> None:
    buckets = []
    cumulative = 0
    for bound, count in zip(h["bounds"], h["counts"]):
        cumulative += count
        buckets.append((repr(bound), cumulative))
    cumulative += h["counts"][-1]
    buckets.append(("+Inf", cumulative))
    family.add_metric(values, buckets, h["sum"])


class TransportCollector:
    """A prometheus_client collector of one kvxfer transport."""

    def __init__(self, transport: Any) -> None:
        self._transport = weakref.ref(transport)

    def describe(self) -> list:
        # Nothing up front: the families depend on the engine's counters,
        # and describing would take a snapshot at registration.
        return []

    def collect(self) -> Iterator[Any]:
        transport = self._transport()
        if transport is None or transport.closed:
            return
        try:
            m = transport.metrics()
        except RuntimeError:  # closed meanwhile
            return
        yield from _families(m)


def _families(m: dict) -> Iterator[Any]:
    agent = m["agent"]
    for name, field, help_text in _OP_COUNTERS:
        f = CounterMetricFamily(name, help_text, labels=["agent", "op"])
        for op in _OPS:
            f.add_metric([agent, op], m["ops"][op][field])
        yield f
    for name, field, help_text in (
        ("kvxfer_post_failures", "post_failures", "Posts that failed (nothing was sent)."),
        (
            "kvxfer_posts_refused",
            "posts_refused",
            "Posts refused without a strike: a peer at its in-flight limit, or faulted.",
        ),
        ("kvxfer_strikes", "strikes_total", "Strikes given to peers (consecutive failures)."),
    ):
        f = CounterMetricFamily(name, help_text, labels=["agent"])
        f.add_metric([agent], m[field])
        yield f
    f = CounterMetricFamily(
        "kvxfer_faults", "Peer registrations faulted, by cause.", labels=["agent", "cause"]
    )
    for cause, count in m["faults"].items():
        f.add_metric([agent, cause], count)
    yield f
    for name, field, help_text in (
        ("kvxfer_inflight_transfers", "inflight", "Transfers posted and not yet drained."),
        ("kvxfer_peers_registered", "peers_registered", "Peers with a published registration."),
        (
            "kvxfer_registrations_pending",
            "registrations_pending",
            "Asynchronous registrations queued or running.",
        ),
    ):
        g = GaugeMetricFamily(name, help_text, labels=["agent"])
        g.add_metric([agent], m[field])
        yield g
    # Engine counters as the C++ table declares them (kvxfer::engine_counter_info):
    # a public one is its own family, the unstable ones share one, untyped.
    unstable = UnknownMetricFamily(
        "kvxfer_engine_unstable",
        "Engine counters for tuning and debugging, by name (label counter): unstable, any "
        "may change meaning or go away in any release.",
        labels=["agent", "counter"],
    )
    for counter, value in sorted(m["engine_counters"].items()):
        kind, is_public = _kvxfer._engine_counter_info(counter)
        if not is_public:
            unstable.add_metric([agent, counter], value)
            continue
        family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
        f = family(
            f"kvxfer_engine_{_name_part(counter)}",
            f"The engine's {counter}.",
            labels=["agent"],
        )
        f.add_metric([agent], value)
        yield f
    if unstable.samples:
        yield unstable

    h = _histogram(
        "kvxfer_transfer_latency_seconds",
        "Post to done, as seen by the poll() that reports the transfer.",
        ["agent", "op"],
    )
    for op in _OPS:
        _add_histogram(h, [agent, op], m["transfer_latency"][op])
    yield h
    h = _histogram("kvxfer_write_blocks_duration_seconds", "Duration of write_blocks calls.", ["agent"])
    _add_histogram(h, [agent], m["write_blocks_duration"])
    yield h
    h = _histogram("kvxfer_poll_duration_seconds", "Duration of poll calls.", ["agent"])
    _add_histogram(h, [agent], m["poll_duration"])
    yield h

    peers = m["peers"]
    for name, field, help_text in _PEER_OP_COUNTERS:
        f = CounterMetricFamily(name, help_text, labels=["agent", "peer", "op"])
        for peer_id, p in peers.items():
            for op in _OPS:
                f.add_metric([agent, peer_id, op], p["ops"][op][field])
        yield f
    for name, field, help_text in (
        ("kvxfer_peer_post_failures", "post_failures", "Failed posts to the peer."),
        (
            "kvxfer_peer_posts_refused",
            "posts_refused",
            "Posts to the peer refused without a strike (in-flight limit, fault).",
        ),
        ("kvxfer_peer_strikes", "strikes_total", "Strikes given to the peer."),
    ):
        f = CounterMetricFamily(name, help_text, labels=["agent", "peer"])
        for peer_id, p in peers.items():
            f.add_metric([agent, peer_id], p[field])
        yield f
    f = CounterMetricFamily(
        "kvxfer_peer_faults",
        "The peer's registration faulted, by cause (at most one).",
        labels=["agent", "peer", "cause"],
    )
    for peer_id, p in peers.items():
        for cause, count in p["faults"].items():
            f.add_metric([agent, peer_id, cause], count)
    yield f
    for name, field, help_text in (
        ("kvxfer_peer_inflight_transfers", "inflight", "The peer's transfers in flight."),
        ("kvxfer_peer_current_strikes", "strikes", "The peer's consecutive failures now."),
        ("kvxfer_peer_faulted", "faulted", "1 once the peer's registration is faulted."),
    ):
        g = GaugeMetricFamily(name, help_text, labels=["agent", "peer"])
        for peer_id, p in peers.items():
            g.add_metric([agent, peer_id], int(p[field]))
        yield g


def register(
    transport: Any, registry: Optional[CollectorRegistry] = None
) -> TransportCollector:
    """Adds a collector of ``transport`` to ``registry`` (default: the
    prometheus_client default REGISTRY) and returns it; pass it to
    ``registry.unregister`` to take it off again."""
    collector = TransportCollector(transport)
    (REGISTRY if registry is None else registry).register(collector)
    return collector
