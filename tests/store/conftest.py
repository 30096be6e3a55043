"""Store fixtures: a started Store on a fresh key prefix of the session etcd, per test.

The default store runs on a ManualClock (bookkeeping time: claimed_at, deadlines, progress) and
with the reclaimer's periodic scan effectively off, so a test sees a reclaim only when it calls
``scan()`` or when the watch reacts. etcd lease TTLs are real time whatever the clock says.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV, Store
from tests.store.support import LIMITS, NO_SCAN, StoreFactory


@pytest.fixture
def clock() -> ManualClock:
    """The store's clock; tests move it by hand."""
    return ManualClock()


@pytest.fixture
def make_store(
    etcd: EtcdProcess, prefix: str, clock: ManualClock, metrics: Metrics
) -> Iterator[StoreFactory]:
    """Open and start stores on this test's prefix; every one is closed after the test.

    Keyword arguments: ``limits``, ``reclaim`` (start the reclaimer), ``scan_interval``.
    Several stores on one prefix act as several coordinator replicas.
    """
    opened: list[tuple[Store, EtcdKV]] = []

    def factory(
        *,
        limits: ClaimLimits = LIMITS,
        reclaim: bool = True,
        scan_interval: float = NO_SCAN,
        **kwargs: Any,
    ) -> Store:
        kv = EtcdKV.connect([etcd.endpoint])
        store = Store.open(
            kv,
            keys=Keyspace(prefix),
            limits=limits,
            clock=kwargs.pop("clock", clock),
            scan_interval=scan_interval,
            metrics=metrics,
        )
        opened.append((store, kv))
        store.start(reclaim=reclaim)
        return store

    yield factory
    for store, kv in reversed(opened):
        store.close()
        kv.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """A started store (reclaimer on, watch only) with the short test limits."""
    return make_store()
