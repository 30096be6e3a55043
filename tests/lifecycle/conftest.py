"""Lifecycle fixtures: a started store on this test's prefix (several for replica tests), and a
real gRPC server over it with stubs.

The store runs the reclaimer and the releaser with their periodic scans effectively off, so a
release seen by a test came from the watch (or from an explicit ``scan()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess
from coordinator.server import build_server
from coordinator.store import EtcdKV, Store
from coordinator.v1 import admin_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.lifecycle.support import LIMITS, NO_SCAN

StoreFactory = Callable[..., Store]


@pytest.fixture
def make_store(etcd: EtcdProcess, prefix: str) -> Iterator[StoreFactory]:
    """Open and start stores on this test's prefix (each one acts as a replica)."""
    opened: list[tuple[Store, EtcdKV]] = []

    def factory(*, scan_interval: float = NO_SCAN, **kwargs: Any) -> Store:
        kv = EtcdKV.connect([etcd.endpoint])
        store = Store.open(
            kv, keys=Keyspace(prefix), limits=LIMITS, scan_interval=scan_interval, **kwargs
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


@pytest.fixture
def server(store: Store) -> Iterator[str]:
    """A server for ``store`` on a free loopback port (insecure mode: callers name themselves)."""
    srv, port = build_server(store, listen="127.0.0.1:0", max_workers=16, health_interval=0.5)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        srv.stop(grace=None).wait()


@pytest.fixture
def channel(server: str) -> Iterator[grpc.Channel]:
    """An insecure channel to ``server``."""
    with grpc.insecure_channel(server, options=GRPC_OPTIONS) as chan:
        yield chan


@pytest.fixture
def tasks(channel: grpc.Channel) -> tasks_pb2_grpc.TaskServiceStub:
    """TaskService stub."""
    return tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture
def worker(channel: grpc.Channel) -> worker_pb2_grpc.WorkerServiceStub:
    """WorkerService stub."""
    return worker_pb2_grpc.WorkerServiceStub(channel)


@pytest.fixture
def admin(channel: grpc.Channel) -> admin_pb2_grpc.AdminServiceStub:
    """AdminService stub."""
    return admin_pb2_grpc.AdminServiceStub(channel)
