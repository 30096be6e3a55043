"""The Prometheus endpoint: ``GET /metrics`` over HTTP on its own port (``metrics_listen``).

It serves the store's metrics (``coordinator.metrics``: the process's counters and histograms,
``REGISTRY`` unless the store was given others) plus two
gauges read from etcd, ``coordinator_active_leases`` (live claim keys) and
``coordinator_unknown_effects`` (effects PREPARED or UNKNOWN: the backlog to reconcile).

Those two are computed on scrape by a custom collector, with a short cache, rather than by a
periodic loop: a scrape costs one count-only etcd read (two ranges, no values), nothing runs when
nobody scrapes, and the figure is never older than the cache. They describe the keyspace, not
the replica, so every replica reports the same value: aggregate them with ``max``. When etcd
does not answer, the gauges are left out of that scrape (an absent series, not a stale one) and
``coordinator_keyspace_read_errors_total`` counts the failure.

The autoscaling gauges, per queue (``coordinator_queue_ready_tasks``,
``coordinator_queue_oldest_ready_age_seconds``, ``coordinator_queue_claimed_tasks``, and
``coordinator_queues_left_out`` for the cap), come from the store's watch-fed ready and claimed
indexes (coordinator.domain.queue_stats): no etcd read at all, and every replica follows the
same keys, so they too are the same on every replica.

The HTTP server is coordinator.server.bounded_http: a fixed number of threads whatever the
clients do, a deadline per connection and a cap on open connections (prometheus_client's own
server spends a thread per connection and waits on it forever). With ``metrics_tls`` it serves
the gRPC port's certificate.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Iterator

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from coordinator.domain.queue_stats import MAX_REPORTED_QUEUES
from coordinator.errors import ConfigError
from coordinator.server.bounded_http import BoundedHttpServer, HttpLimits
from coordinator.server.startup import bind_error
from coordinator.server.tls import ServerTLS
from coordinator.store import Store
from coordinator.store.etcd.ops import get_prefix

log = structlog.get_logger(__name__)

CACHE_SECONDS = 2.0
"""How long one etcd read answers scrapes (scrapes are usually 15-30 s apart)."""


class KeyspaceCollector(Collector):
    """Active leases and the UNKNOWN/PREPARED effect backlog, read from etcd on scrape."""

    def __init__(self, store: Store, *, cache_seconds: float = CACHE_SECONDS) -> None:
        self._store = store
        self._cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._cached: tuple[float, int, int] | None = None  # (monotonic time, leases, effects)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """Yield both gauges (from the cache when it is fresh)."""
        counts = self._counts()
        if counts is None:
            return
        leases, effects = counts
        yield GaugeMetricFamily(
            "coordinator_active_leases", "Live claim keys (claims whose lease holds).", leases
        )
        yield GaugeMetricFamily(
            "coordinator_unknown_effects",
            "Effects PREPARED or UNKNOWN: sent or maybe sent, outcome not yet known.",
            effects,
        )

    def _counts(self) -> tuple[int, int] | None:
        with self._lock:  # concurrent scrapes share one read
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self._cache_seconds:
                return self._cached[1], self._cached[2]
            keys = self._store.ctx.keys
            try:
                snap = self._store.ctx.kv.read(
                    get_prefix(keys.claims_prefix, count_only=True),
                    get_prefix(keys.open_effects_prefix(), count_only=True),
                )
            except Exception as exc:  # a scrape must answer even when etcd does not
                self._store.ctx.metrics.keyspace_read_errors.inc()
                log.warning("metrics: keyspace read failed", error=str(exc))
                return None
            self._cached = (now, snap.range_count(0), snap.range_count(1))
            return self._cached[1], self._cached[2]


class QueueCollector(Collector):
    """Ready, oldest ready age, claimed, blocked and overdue per queue, from the store's
    in-memory indexes."""

    def __init__(self, store: Store, *, cap: int = MAX_REPORTED_QUEUES) -> None:
        self._store = store
        self._cap = cap

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """Yield the five per-queue gauges and the count of queues left out by the cap."""
        report = self._store.queue_report(cap=self._cap)
        ready = GaugeMetricFamily(
            "coordinator_queue_ready_tasks", "READY tasks of the queue now.", labels=["queue"]
        )
        age = GaugeMetricFamily(
            "coordinator_queue_oldest_ready_age_seconds",
            "Seconds the queue's longest-waiting READY task has waited (0 with none ready).",
            labels=["queue"],
        )
        claimed = GaugeMetricFamily(
            "coordinator_queue_claimed_tasks", "CLAIMED tasks of the queue now.", labels=["queue"]
        )
        blocked = GaugeMetricFamily(
            "coordinator_queue_blocked_tasks",
            "WAITING tasks of the queue blocked by a FAILED or CANCELLED upstream now.",
            labels=["queue"],
        )
        overdue = GaugeMetricFamily(
            "coordinator_queue_overdue_tasks",
            "WAITING tasks of the queue past their schedule_to_close now (not failed).",
            labels=["queue"],
        )
        for stats in report.queues:
            ready.add_metric([stats.queue], stats.ready)
            age.add_metric([stats.queue], stats.oldest_ready_age)
            claimed.add_metric([stats.queue], stats.claimed)
            blocked.add_metric([stats.queue], stats.blocked)
            overdue.add_metric([stats.queue], stats.overdue)
        yield from (ready, age, claimed, blocked, overdue)
        yield GaugeMetricFamily(
            "coordinator_queues_left_out",
            f"Queues with work not reported per queue: more than {self._cap} have work "
            "(an autoscaler sees a left-out queue as empty).",
            report.left_out,
        )


class _Forward(Collector):
    """Every metric of another registry (the store's) in this one."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[object]:  # type: ignore[override]
        """Yield the other registry's metrics."""
        return iter(self._registry.collect())


DEFAULT_LIMITS = HttpLimits()


def start_metrics(
    store: Store,
    listen: str,
    *,
    limits: HttpLimits = DEFAULT_LIMITS,
    tls: ServerTLS | None = None,
) -> BoundedHttpServer:
    """Serve the metrics of this process and ``store``'s keyspace on ``listen`` (port 0: free),
    within ``limits`` (see coordinator.server.bounded_http), over TLS with ``tls``'s
    certificate when given. ``close()`` the result to stop it.

    ConfigError naming ``metrics_listen`` if the address cannot be bound.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Forward(store.ctx.metrics.registry))
    registry.register(KeyspaceCollector(store))
    registry.register(QueueCollector(store))
    contexts = tls.ssl_contexts() if tls is not None else None  # bad files fail before binding
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, int(port)), family=family)
    except OSError as exc:
        raise ConfigError(bind_error(listen, exc, "metrics_listen")) from exc
    return BoundedHttpServer(make_wsgi_app(registry), sock, limits, tls=contexts)
