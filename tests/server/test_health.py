"""gRPC health follows etcd for real, and reflection describes the three services."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.sdk import CallRetry, TransportError, WorkerClient
from coordinator.server import SERVICE_NAMES, build_server
from coordinator.store import EtcdKV, Keyspace, Store
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICES = {f"coordinator.v1.{name}" for name in ("WorkerService", "TaskService", "AdminService")}


def _status(stub: health_pb2_grpc.HealthStub, service: str = "") -> int:
    return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status)


def test_serving_for_the_server_and_each_service(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    assert set(SERVICE_NAMES) == SERVICES
    for service in ("", *SERVICE_NAMES):
        assert _status(stub, service) == SERVING, service


def test_reflection_lists_and_describes_the_services(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    listed = set(database.get_services())
    assert listed >= SERVICES | {"grpc.health.v1.Health"}

    pool = DescriptorPool(database)
    worker = pool.FindServiceByName("coordinator.v1.WorkerService")
    assert {m.name for m in worker.methods} == {
        "Claim",
        "ClaimNext",
        "Renew",
        "RenewMany",
        "AuthorizeTool",
        "StageResult",
        "Commit",
        "Release",
        "Fail",
        "PrepareEffect",
        "RecordEffect",
        "GetEffect",
        "ListOpenEffects",
        "ListEffects",
        "ResolveEffect",
        "StartJob",
        "FinishJob",
        "ListJobs",
    }
    fence = pool.FindMessageTypeByName("coordinator.v1.Fence")
    assert "claim_generation" in fence.fields_by_name


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """An etcd of this test's own (it gets stopped), keeping its data and ports across restarts."""
    with EtcdProcess(binary=find_etcd_binary(), data_dir=tmp_path / "etcd") as proc:
        yield proc


def test_health_follows_etcd(own_etcd: EtcdProcess, prefix: str) -> None:
    kv = EtcdKV.connect([own_etcd.endpoint], timeout=1.0)
    store = Store.open(kv, keys=Keyspace(prefix))
    store.start(reclaim=False)
    server, port = build_server(store, health_interval=0.1)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            assert _status(stub) == SERVING

            own_etcd.stop()
            eventually(lambda: _status(stub) == NOT_SERVING, timeout=15)
            assert _status(stub, "coordinator.v1.WorkerService") == NOT_SERVING
            # A read while etcd is down says what is down, and that nothing changed.
            refused = eventually(lambda: _read_refusal(port), timeout=15)
            assert refused.startswith("UNAVAILABLE: etcd ")
            assert refused.endswith(
                "no etcd endpoint is reachable (etcd is down, or not reachable from this "
                "replica); a read, nothing changed: repeat it"
            ), refused

            own_etcd.start()
            eventually(lambda: _status(stub) == SERVING, timeout=15)
    finally:
        server.stop(grace=None).wait()
        store.close()
        kv.close()


NO_RETRY = CallRetry(attempts=1)


def _read_refusal(port: int) -> str | None:
    """The message of a GetTask through the SDK, once it names etcd's unreachable endpoints."""
    with WorkerClient(f"127.0.0.1:{port}", principal="pm", retry=NO_RETRY) as client:
        try:
            client.get_task("t")
        except TransportError as exc:
            return str(exc) if "no etcd endpoint" in str(exc) else None
    return None
