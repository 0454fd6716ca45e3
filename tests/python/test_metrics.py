# SPDX-License-Identifier: Apache-2.0
"""kvxfer.metrics end to end: a transport's collector on a prometheus_client
registry, served over HTTP on loopback, scraped and parsed, with figures
checked against a known number of transfers."""

import http.server
import threading
import urllib.request

import numpy as np
import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.exposition import MetricsHandler  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import kvxfer  # noqa: E402
import kvxfer.metrics  # noqa: E402

from conftest import connect  # noqa: E402


def drain(t, peer, expected):
    done, failed = [], []
    for _ in range(1000):
        r = t.poll(peer)
        done += r.done
        failed += r.failed
        if len(done) + len(failed) >= expected:
            break
    assert len(done) + len(failed) == expected
    return done, failed


@pytest.fixture
def served():
    """served(registry) -> the /metrics text of prometheus_client's HTTP
    handler for `registry`, served on 127.0.0.1 at an ephemeral port."""
    servers = []

    def scrape(registry):
        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), MetricsHandler.factory(registry)
        )
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert resp.status == 200
            return resp.read().decode()

    yield scrape
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def timed_pair(make_agent):
    """(a, b) as `pair`, a timing every call and transfer (exact histogram counts)."""
    a, b = make_agent(latency_sample_every=1), make_agent()
    connect(a, b, "b")
    return a, b


def samples(text):
    """{(sample name, frozenset of labels): value} and {family: type}."""
    values, types = {}, {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values, types


def value(values, name, **labels):
    return values[(name, frozenset(labels.items()))]


def test_scraped_metrics_count_the_transfers_made(timed_pair, served):
    a, b = timed_pair
    registry = prometheus_client.CollectorRegistry()
    kvxfer.metrics.register(a, registry)
    for i in range(6):
        assert a.write_blocks("b", np.array([i, i + 8]), np.array([i, i + 8])) is not None
    for i in range(2):
        assert a.read_blocks("b", np.array([14 + i]), np.array([i])) is not None
    assert a.send_notification("b", b"hello") is not None
    drain(a, "b", 9)

    values, types = samples(served(registry))
    agent = a.agent_name
    assert types["kvxfer_transfers_done"] == "counter"
    assert types["kvxfer_inflight_transfers"] == "gauge"
    assert types["kvxfer_transfer_latency_seconds"] == "histogram"
    assert value(values, "kvxfer_transfers_done_total", agent=agent, op="write") == 6
    assert value(values, "kvxfer_transfers_done_total", agent=agent, op="read") == 2
    assert value(values, "kvxfer_transfers_done_total", agent=agent, op="notify") == 1
    assert value(values, "kvxfer_bytes_done_total", agent=agent, op="write") == 6 * 2 * 64
    assert value(values, "kvxfer_bytes_done_total", agent=agent, op="read") == 2 * 64
    assert value(values, "kvxfer_peer_transfers_done_total", agent=agent, peer="b", op="write") == 6
    assert value(values, "kvxfer_peers_registered", agent=agent) == 1
    assert value(values, "kvxfer_inflight_transfers", agent=agent) == 0
    assert value(values, "kvxfer_transfer_latency_seconds_count", agent=agent, op="write") == 6
    assert (
        value(values, "kvxfer_transfer_latency_seconds_bucket", agent=agent, op="write", le="+Inf")
        == 6
    )
    assert value(values, "kvxfer_write_blocks_duration_seconds_count", agent=agent) == 6

    # The same figures as stats().
    s = a.stats()["peers"]["b"]
    assert s["transfers_done"] == sum(
        value(values, "kvxfer_peer_transfers_done_total", agent=agent, peer="b", op=op)
        for op in ("write", "read", "notify")
    )
    assert s["bytes_done"] == value(
        values, "kvxfer_peer_bytes_done_total", agent=agent, peer="b", op="write"
    ) + value(values, "kvxfer_peer_bytes_done_total", agent=agent, peer="b", op="read")


def test_scraped_faults_and_failures(pair, served):
    a, b = pair
    registry = prometheus_client.CollectorRegistry()
    kvxfer.metrics.register(a, registry)
    plan = kvxfer.loopback.fault_plan(a)
    tid = a.write_blocks("b", np.array([1]), np.array([1]))
    plan.finish_with(tid, kvxfer.Status.BACKEND)
    drain(a, "b", 1)
    plan.disconnect(b.agent_name)
    for _ in range(2):
        assert a.write_blocks("b", np.array([2]), np.array([2])) is None

    values, _ = samples(served(registry))
    agent = a.agent_name
    assert value(values, "kvxfer_transfers_failed_total", agent=agent, op="write") == 1
    # The first post failed and faulted the peer; the second was refused
    # without being tried (a faulted peer takes no new transfers).
    assert value(values, "kvxfer_post_failures_total", agent=agent) == 1
    assert value(values, "kvxfer_posts_refused_total", agent=agent) == 1
    assert value(values, "kvxfer_peer_posts_refused_total", agent=agent, peer="b") == 1
    assert value(values, "kvxfer_strikes_total", agent=agent) == 1
    assert value(values, "kvxfer_faults_total", agent=agent, cause="REMOTE_DISCONNECT") == 1
    assert value(values, "kvxfer_faults_total", agent=agent, cause="STALLED") == 0
    assert (
        value(values, "kvxfer_peer_faults_total", agent=agent, peer="b", cause="REMOTE_DISCONNECT")
        == 1
    )
    assert value(values, "kvxfer_peer_faulted", agent=agent, peer="b") == 1
    assert a.stats()["peers"]["b"]["post_failures"] == 1
    assert a.stats()["peers"]["b"]["posts_refused"] == 1


def test_two_transports_on_one_registry_and_a_closed_one_yields_nothing(make_agent, served):
    a, b = make_agent(), make_agent()
    connect(a, b, "b")
    registry = prometheus_client.CollectorRegistry()
    kvxfer.metrics.register(a, registry)
    kvxfer.metrics.register(b, registry)
    assert a.write_blocks("b", np.array([0]), np.array([0])) is not None
    drain(a, "b", 1)

    values, _ = samples(served(registry))
    assert value(values, "kvxfer_transfers_done_total", agent=a.agent_name, op="write") == 1
    assert value(values, "kvxfer_transfers_done_total", agent=b.agent_name, op="write") == 0

    a.close()
    values, _ = samples(served(registry))
    assert ("kvxfer_peers_registered", frozenset({("agent", a.agent_name)})) not in values
    assert value(values, "kvxfer_peers_registered", agent=b.agent_name) == 0


def test_snapshot_matches_the_cxx_text(pair):
    a, _ = pair
    assert a.write_blocks("b", np.array([3]), np.array([3])) is not None
    drain(a, "b", 1)
    text = a.prometheus_text()
    values, types = samples(text)
    assert types["kvxfer_poll_duration_seconds"] == "histogram"
    assert value(values, "kvxfer_transfers_done_total", agent=a.agent_name, op="write") == 1
    assert a.metrics()["ops"]["write"]["transfers_done"] == 1


def test_engine_counters_are_exposed_as_the_table_declares(pair):
    a, _ = pair
    m = a.metrics()
    # A loopback transport has no engine counters: these stand for a UCX one's.
    m["engine_counters"] = {"cma_writes": 5, "ucx_progress_wakes": 7, "a_new_debug_counter": 1}

    class Snapshot:
        def collect(self):
            yield from kvxfer.metrics._families(m)

    registry = prometheus_client.CollectorRegistry()
    registry.register(Snapshot())
    values, types = samples(prometheus_client.generate_latest(registry).decode())
    agent = a.agent_name
    assert types["kvxfer_engine_cma_writes"] == "counter"
    assert value(values, "kvxfer_engine_cma_writes_total", agent=agent) == 5
    # A tuning counter, and one the table does not know, are no family of their own.
    assert not any("progress_wakes" in name or "new_debug" in name for name in types)
    assert types["kvxfer_engine_unstable"] == "unknown"  # TYPE untyped in the text
    assert value(values, "kvxfer_engine_unstable", agent=agent, counter="ucx_progress_wakes") == 7
    assert value(values, "kvxfer_engine_unstable", agent=agent, counter="a_new_debug_counter") == 1
