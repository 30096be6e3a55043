"""Space fixtures: each test gets its own etcd with a 1 MiB backend quota (it may fill it, and
etcd's alarm is cluster-wide), a store and server over it, and the db-size watch to drive by
hand (``check()``), so a test decides exactly when the guard reads etcd."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import etcd3
import grpc
import pytest

from coordinator.domain.keys import Keyspace
from coordinator.domain.roles import Role
from coordinator.domain.space import refuses_every_txn_at_nospace
from coordinator.domain.write_budget import BudgetPolicy
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.metrics import Metrics
from coordinator.server import build_server
from coordinator.store import EtcdKV, Store
from coordinator.store.etcd.space_guard import SpaceGuard
from tests.conftest import GRPC_OPTIONS
from tests.helpers import Probe

QUOTA = 1 << 20
"""etcd's --quota-backend-bytes here: filled by 25 puts of 100 KiB (measured, etcd 3.4)."""
RETRY_AFTER = 1.0


@pytest.fixture
def quota_etcd() -> Iterator[EtcdProcess]:
    """An etcd of this test's own with a 1 MiB quota."""
    with EtcdProcess(
        binary=find_etcd_binary(), compaction_retention=None, quota_backend_bytes=QUOTA
    ) as proc:
        yield proc


@pytest.fixture
def raw(quota_etcd: EtcdProcess) -> Iterator[Any]:
    """A plain ``etcd3`` client of that etcd (no guard between it and etcd)."""
    client = etcd3.client(quota_etcd.host, quota_etcd.port, timeout=10, grpc_options=GRPC_OPTIONS)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def kv(quota_etcd: EtcdProcess, metrics: Metrics) -> Iterator[EtcdKV]:
    """The coordinator's connection, its space guard counting on this test's metrics."""
    conn = EtcdKV.connect([quota_etcd.endpoint], timeout=5.0)
    conn.space = SpaceGuard(retry_after=RETRY_AFTER, metrics=metrics)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def store(kv: EtcdKV, prefix: str, metrics: Metrics) -> Iterator[Store]:
    """A started store over the quota etcd (overrides the shared fixture, so ``server`` and
    the stubs serve it)."""
    opened = Store.open(kv, keys=Keyspace(prefix), scan_interval=1.0, metrics=metrics)
    opened.start()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def probe(raw: Any, prefix: str) -> Probe:
    """(number of keys, highest mod_revision) under this test's prefix."""

    def read() -> tuple[int, int]:
        metas = [meta for _, meta in raw.get_prefix(prefix + "/")]
        return len(metas), max((m.mod_revision for m in metas), default=0)

    return read


def fill(raw: Any) -> int:
    """Put 100 KiB values (outside the coordinator's prefix) until etcd refuses one: its
    NOSPACE alarm is then raised. Returns how many it took."""
    for i in range(200):
        try:
            raw.put(f"/filler/{i % 4}", b"x" * (100 << 10))
        except Exception:  # etcd3 raises grpc's error for RESOURCE_EXHAUSTED
            return i
    raise AssertionError("etcd never refused a put: is its quota set?")


def refuses_every_txn(raw: Any) -> bool:
    """Whether this etcd refuses every txn while NOSPACE, even one that only reads
    (domain/space.py ``refuses_every_txn_at_nospace``): the coordinator answers its write-free
    txns by Range reads there (store/etcd/nospace_reads.py); deletes stay refused."""
    return refuses_every_txn_at_nospace(str(raw.status().version))


BUDGETS = {
    Role.WORKER: BudgetPolicy(rate=1.0, window=100_000.0),
    Role.PM: BudgetPolicy(rate=10.0, window=100_000.0),
}
"""100,000 bytes a worker and 1,000,000 a producer (a create of a small task is charged about
3.4 KB), refilled at 1 and 10 bytes/s: nothing a test would notice."""


@contextlib.contextmanager
def budgeted_channel(store: Store, **options: Any) -> Iterator[grpc.Channel]:
    """A channel to a server over ``store`` with ``BUDGETS`` (and build_server's ``options``),
    stopped after."""
    srv, port = build_server(
        store,
        listen="127.0.0.1:0",
        max_workers=8,
        health_interval=0.2,
        write_budgets=BUDGETS,
        **options,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as chan:
            yield chan
    finally:
        srv.stop(grace=None).wait()
