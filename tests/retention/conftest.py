"""Retention fixtures: stores on this test's prefix with a short retention and a local archive
in a temporary directory; time is a ManualClock the test moves past the retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.archive import ArchiveSink
from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.keys import Keyspace
from coordinator.domain.retention import RetentionPolicy
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV, Store
from coordinator.store.retention.pruner import DEFAULT_INTERVAL as DEFAULT_PRUNE_INTERVAL
from tests.store.support import LIMITS, NO_SCAN

RETENTION = 60.0
TOMBSTONE_RETENTION = 3600.0
POLICY = RetentionPolicy(default=RETENTION, tombstone=TOMBSTONE_RETENTION)


@pytest.fixture
def clock() -> ManualClock:
    """The stores' clock; tests move it past the retention by hand."""
    return ManualClock()


@pytest.fixture
def sink(tmp_path: Path) -> LocalSink:
    """A local archive directory for this test."""
    return LocalSink(tmp_path / "archive")


@pytest.fixture
def make_store(
    etcd: EtcdProcess, prefix: str, clock: ManualClock, sink: LocalSink, metrics: Metrics
) -> Iterator[Any]:
    """``make_store(*, archive=sink, retention=POLICY, reclaim=False, prune_interval=...)``: a
    started store whose pruner is not started (tests call ``run_pass``) unless ``reclaim`` starts
    the background loops; several act as several replicas."""
    opened: list[tuple[Store, EtcdKV]] = []

    def factory(
        *,
        archive: ArchiveSink | None = sink,
        retention: RetentionPolicy = POLICY,
        reclaim: bool = False,
        prune_interval: float = DEFAULT_PRUNE_INTERVAL,
    ) -> Store:
        kv = EtcdKV.connect([etcd.endpoint])
        store = Store.open(
            kv,
            keys=Keyspace(prefix),
            limits=LIMITS,
            clock=clock,
            scan_interval=NO_SCAN,
            retention=retention,
            archive=archive,
            prune_interval=prune_interval,
            metrics=metrics,
        )
        opened.append((store, kv))
        store.start(reclaim=reclaim)
        return store

    yield factory
    for store, kv in reversed(opened):
        store.close()
        kv.close()
