"""The server fixtures every directory shares (a pytest plugin, loaded by tests/conftest.py):
a started store on this test's own key prefix counting on its own metrics registry, a real
gRPC server over it, a channel, the three
stubs, a probe of the keyspace, and a claimed task.

A directory that needs another store (a ManualClock, scans off, several replicas) or another
server (tokens, TLS) overrides ``store`` or ``server`` in its conftest; everything built on them
follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.server import PRINCIPAL_METADATA_KEY, build_server
from coordinator.store import EtcdKV, Store
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.conftest import GRPC_OPTIONS
from tests.helpers import RETRY_AT_ONCE, Probe

INPUT = b'{"prompt": "summarise the design"}'
"""The input of the ``claimed`` task."""


@pytest.fixture
def metrics() -> Metrics:
    """This test's own metrics (a fresh registry): what it counts is exactly what it did,
    never a delta of the process-wide registry."""
    return Metrics(CollectorRegistry(auto_describe=True))


@pytest.fixture
def store(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Store]:
    """A started store over the session etcd, in this test's own keyspace, whose tasks are
    claimable again at once after an attempt ends (RETRY_AT_ONCE: these tests are about
    claims, fences and outcomes; the default backoff has tests of its own)."""
    kv = EtcdKV.connect([etcd.endpoint], timeout=5.0)
    store = Store.open(
        kv,
        keys=Keyspace(prefix),
        limits=ClaimLimits(retry=RETRY_AT_ONCE),
        scan_interval=1.0,
        metrics=metrics,
    )
    store.start()
    try:
        yield store
    finally:
        store.close()
        kv.close()


@pytest.fixture
def server(store: Store) -> Iterator[str]:
    """A server for ``store`` on a free loopback port (insecure mode: callers name
    themselves); yields its ``host:port``."""
    srv, port = build_server(store, listen="127.0.0.1:0", max_workers=16, health_interval=0.2)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        srv.stop(grace=None).wait()


@pytest.fixture
def channel(server: str) -> Iterator[grpc.Channel]:
    """A plaintext channel to ``server``."""
    with grpc.insecure_channel(server, options=GRPC_OPTIONS) as chan:
        yield chan


@pytest.fixture
def worker(channel: grpc.Channel) -> worker_pb2_grpc.WorkerServiceStub:
    """WorkerService stub."""
    return worker_pb2_grpc.WorkerServiceStub(channel)


@pytest.fixture
def tasks(channel: grpc.Channel) -> tasks_pb2_grpc.TaskServiceStub:
    """TaskService stub."""
    return tasks_pb2_grpc.TaskServiceStub(channel)


@pytest.fixture
def admin(channel: grpc.Channel) -> admin_pb2_grpc.AdminServiceStub:
    """AdminService stub."""
    return admin_pb2_grpc.AdminServiceStub(channel)


@pytest.fixture
def keyspace(etcd_client: Any, prefix: str) -> Probe:
    """A probe of this test's keyspace: (number of keys, highest mod_revision) under prefix."""

    def probe() -> tuple[int, int]:
        metas = [meta for _, meta in etcd_client.get_prefix(prefix + "/")]
        return len(metas), max((m.mod_revision for m in metas), default=0)

    return probe


@pytest.fixture
def claimed(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
) -> worker_pb2.ClaimResponse:
    """Task "t-1" created through TaskService and claimed by worker-a (30 s lease).

    The response carries the fence and the input (``input``, ``input_digest``).
    """
    tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="t-1", input=INPUT, input_digest=digest_of(INPUT))
    )
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=epoch, ttl_seconds=30),
        metadata=((PRINCIPAL_METADATA_KEY, "worker-a"),),
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim
