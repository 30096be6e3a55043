"""Lifecycle fixtures: a started store on this test's prefix (several for replica tests); the
server, channel and stubs over it are the shared ones (tests/fixtures.py).

The store runs the reclaimer and the releaser with their periodic scans effectively off, so a
release seen by a test came from the watch (or from an explicit ``scan()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV, Store
from tests.lifecycle.support import LIMITS, NO_SCAN

StoreFactory = Callable[..., Store]


@pytest.fixture
def make_store(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[StoreFactory]:
    """Open and start stores on this test's prefix (each one acts as a replica)."""
    opened: list[tuple[Store, EtcdKV]] = []

    def factory(*, scan_interval: float = NO_SCAN, **kwargs: Any) -> Store:
        kv = EtcdKV.connect([etcd.endpoint])
        store = Store.open(
            kv,
            keys=Keyspace(prefix),
            limits=LIMITS,
            scan_interval=scan_interval,
            metrics=metrics,
            **kwargs,
        )
        opened.append((store, kv))
        store.start()
        return store

    yield factory
    for store, kv in reversed(opened):
        store.close()
        kv.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """One started store (reclaimer and releaser on, watch-driven)."""
    return make_store()
