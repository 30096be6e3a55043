"""The version gate: an old coordinator refused at start, an old SDK refused per call, and
raising a minimum bumping the epoch in the same txn."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import coordinator
from coordinator.domain.versions import SCHEMA_VERSION, VersionRecord
from coordinator.errors import FailedPrecondition
from coordinator.etcd_process import EtcdProcess
from coordinator.server.identity import PRINCIPAL_METADATA_KEY
from coordinator.server.interceptors.auth import ROLE_TABLE
from coordinator.server.interceptors.version_gate import (
    SDK_VERSION_METADATA_KEY,
    VersionGateInterceptor,
)
from coordinator.store import Keyspace
from coordinator.store.control.versions import Standing, VersionStore
from coordinator.v1 import admin_pb2, admin_pb2_grpc, tasks_pb2, tasks_pb2_grpc
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.sdk.support import Served, served

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]
OWN = coordinator.__version__


def _serve(etcd: EtcdProcess, prefix: str) -> subprocess.CompletedProcess[str]:
    args = ["serve", "--etcd", etcd.endpoint, "--prefix", prefix, "--insecure"]
    return subprocess.run(
        [*COMMAND, *args, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_old_coordinator_refuses_to_start(
    etcd: EtcdProcess, etcd_client: Any, prefix: str
) -> None:
    record = VersionRecord(min_coordinator_version="99.0.0")
    etcd_client.put(Keyspace(prefix).versions, record.encode())
    result = _serve(etcd, prefix)
    assert result.returncode == 2, result.stderr
    assert (
        f"coordinator version {OWN} is below the keyspace's minimum coordinator version 99.0.0"
        in result.stderr
    )
    # It stopped before the store started: the keyspace holds nothing but the record.
    keys = [meta.key.decode() for _, meta in etcd_client.get_prefix(prefix + "/")]
    assert keys == [Keyspace(prefix).versions]


def test_a_coordinator_knowing_an_older_schema_refuses_to_start(
    etcd: EtcdProcess, etcd_client: Any, prefix: str
) -> None:
    etcd_client.put(
        Keyspace(prefix).versions, VersionRecord(schema_version=SCHEMA_VERSION + 1).encode()
    )
    result = _serve(etcd, prefix)
    assert result.returncode == 2, result.stderr
    assert (
        f"knows keyspace schema {SCHEMA_VERSION}, but the keyspace is at schema "
        f"{SCHEMA_VERSION + 1}" in result.stderr
    )


@pytest.fixture
def coord(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as s:
        yield s


def _list(target: str, *metadata: tuple[str, str]) -> tasks_pb2.ListTasksResponse:
    with grpc.insecure_channel(target, options=GRPC_OPTIONS) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        reply: tasks_pb2.ListTasksResponse = stub.ListTasks(
            tasks_pb2.ListTasksRequest(), metadata=((PRINCIPAL_METADATA_KEY, "w1"), *metadata)
        )
        return reply


def test_the_store_writes_the_record_once(coord: Served, etcd_client: Any, prefix: str) -> None:
    value, _ = etcd_client.get(Keyspace(prefix).versions)
    assert VersionRecord.decode(value) == VersionRecord()
    VersionStore(coord.store.ctx).set_minimums(min_sdk_version="2.0")
    coord.store.admin.ensure_initialized()  # a restart does not reset the minimums
    assert VersionStore(coord.store.ctx).read().min_sdk_version == "2.0"


def _set_and_seen(coord: Served, **minimums: Any) -> None:
    """Set the minimums and wait until the replica's cached reading (its 2 s TTL) has them."""
    record = VersionStore(coord.store.ctx).set_minimums(**minimums).record
    eventually(
        lambda: coord.store.standing.record() == record,
        timeout=10.0,
        message="the replica's reading never had the new record",
    )


def test_an_old_sdk_is_refused_naming_the_minimum(
    coord: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_and_seen(coord, min_sdk_version="9.0.0")
    with pytest.raises(grpc.RpcError) as raised:
        _list(coord.target, (SDK_VERSION_METADATA_KEY, "8.9.9"))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert raised.value.details() == (
        "SDK version 8.9.9 is below the minimum SDK version 9.0.0; upgrade the coordinator SDK"
    )
    # At the minimum, or without the header (a raw client, not required): admitted.
    assert list(_list(coord.target, (SDK_VERSION_METADATA_KEY, "9.0.0")).tasks) == []
    assert list(_list(coord.target).tasks) == []
    # The SDK itself sends its version: this one (OWN) is below 9.0.0 ...
    with coord.client("w1") as client, pytest.raises(FailedPrecondition, match=r"9\.0\.0"):
        client.list_tasks()
    # ... and a newer SDK build is admitted.
    monkeypatch.setattr("coordinator.sdk._core.calls.__version__", "9.1")
    with coord.client("w1") as client:
        assert client.list_tasks() == []


def test_require_sdk_version_refuses_raw_clients(coord: Served) -> None:
    _set_and_seen(coord, require_sdk_version=True)
    with pytest.raises(grpc.RpcError) as raised:
        _list(coord.target)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "x-coordinator-sdk-version" in str(raised.value.details())
    assert list(_list(coord.target, (SDK_VERSION_METADATA_KEY, OWN)).tasks) == []


def test_admin_calls_pass_the_sdk_check(coord: Served) -> None:
    VersionStore(coord.store.ctx).set_minimums(min_sdk_version="9.0.0", require_sdk_version=True)
    with grpc.insecure_channel(coord.target, options=GRPC_OPTIONS) as channel:
        reply = admin_pb2_grpc.AdminServiceStub(channel).GetVersions(
            admin_pb2.GetVersionsRequest(),
            metadata=((PRINCIPAL_METADATA_KEY, "ops"), (SDK_VERSION_METADATA_KEY, "0.0.1")),
        )
    assert reply.versions.min_sdk_version == "9.0.0"
    assert reply.coordinator_version == OWN


def test_a_running_replica_below_a_raised_minimum_refuses_calls(coord: Served) -> None:
    """UNAVAILABLE, not FAILED_PRECONDITION: the replica is out of date, not the caller, so the
    SDK moves on to another replica and a pool keeps polling (a FAILED_PRECONDITION stopped
    every pool connected to a lagging replica); its readiness says NOT_SERVING."""
    assert list(_list(coord.target).tasks) == []  # fills the gate's cache
    VersionStore(coord.store.ctx, own_version="99.0").set_minimums(min_coordinator_version="99.0")

    def refused() -> str | None:
        try:
            _list(coord.target)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            return str(exc.details())
        return None

    details = eventually(refused, timeout=10.0)
    assert details == (
        f"coordinator version {OWN} is below the keyspace's minimum coordinator version 99.0; "
        "upgrade the coordinator (this replica serves nothing until then; another replica may "
        "serve the call)"
    )
    with grpc.insecure_channel(coord.target, options=GRPC_OPTIONS) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        ready = health_pb2.HealthCheckRequest(service="coordinator.v1.WorkerService")
        not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
        eventually(lambda: health.Check(ready).status == not_serving, timeout=15.0)
        admin = admin_pb2_grpc.AdminServiceStub(channel)
        ops = ((PRINCIPAL_METADATA_KEY, "ops"),)
        # The operator reads the record and undoes the raise through the refused replica.
        shown = admin.GetVersions(admin_pb2.GetVersionsRequest(), metadata=ops)
        assert shown.versions.min_coordinator_version == "99.0"
        raise_more = admin_pb2.SetMinimumVersionsRequest(min_sdk_version="1.0")
        with pytest.raises(grpc.RpcError) as still:
            admin.SetMinimumVersions(raise_more, metadata=ops)
        assert still.value.code() == grpc.StatusCode.UNAVAILABLE
        lower = admin_pb2.SetMinimumVersionsRequest(min_coordinator_version=OWN, allow_lower=True)
        assert admin.SetMinimumVersions(lower, metadata=ops).versions.min_coordinator_version == OWN

    def admitted() -> bool:
        try:
            return list(_list(coord.target).tasks) == []
        except grpc.RpcError:
            return False  # the replica's reading of the record is up to 2 s old

    eventually(admitted, timeout=10.0, message="not admitted again after the lowering")


def test_the_gate_and_the_loops_read_the_record_through_one_cache() -> None:
    reads: list[int] = []

    def read() -> VersionRecord:
        reads.append(1)
        return VersionRecord()

    standing = Standing(read, ttl=60.0)
    gate = VersionGateInterceptor(standing)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    gated = gate.build("/coordinator.v1.TaskService/ListTasks", handler).unary_unary
    assert gated is not None

    class Context:
        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return ((SDK_VERSION_METADATA_KEY, OWN),)

    for n in range(50):
        assert gated(n, Context()) == n  # type: ignore[arg-type]
        assert standing.refusal() is None  # what a background loop asks between calls
    assert len(reads) == 1


def _admin(target: str, method: str, request: Any) -> Any:
    with grpc.insecure_channel(target, options=GRPC_OPTIONS) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        return getattr(stub, method)(request, metadata=((PRINCIPAL_METADATA_KEY, "ops"),))


def test_raising_a_minimum_bumps_the_epoch_in_the_same_txn(
    coord: Served, etcd_client: Any, prefix: str
) -> None:
    keys = Keyspace(prefix)
    before = coord.store.admin.epoch()
    reply = _admin(
        coord.target,
        "SetMinimumVersions",
        admin_pb2.SetMinimumVersionsRequest(min_coordinator_version="0.1.0", min_sdk_version="0.1"),
    )
    assert reply.epoch == before + 1
    assert coord.store.admin.epoch() == before + 1
    assert reply.versions.min_coordinator_version == "0.1.0"
    assert reply.versions.min_sdk_version == "0.1"
    _, versions_meta = etcd_client.get(keys.versions)
    _, epoch_meta = etcd_client.get(keys.epoch)
    assert versions_meta.mod_revision == epoch_meta.mod_revision  # one txn wrote both


def test_lowering_or_a_bad_version_is_refused_and_writes_nothing(
    coord: Served, etcd_client: Any, prefix: str
) -> None:
    VersionStore(coord.store.ctx).set_minimums(min_sdk_version="2.0")
    _, epoch_meta = etcd_client.get(Keyspace(prefix).epoch)

    def refused(**fields: Any) -> tuple[grpc.StatusCode, str]:
        request = admin_pb2.SetMinimumVersionsRequest(**fields)
        with pytest.raises(grpc.RpcError) as info:
            _admin(coord.target, "SetMinimumVersions", request)
        return info.value.code(), str(info.value.details())

    code, said = refused(min_sdk_version="1.9")
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "min_sdk_version: 1.9 is below the current minimum 2.0" in said
    code, said = refused(min_coordinator_version="soon")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_coordinator_version" in said
    # Once INTERNAL: packaging refuses a release number of 100,000 digits with a ValueError.
    assert refused(min_sdk_version="1." + "9" * 100_000) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "min_sdk_version: 100002 characters is not a version (at most 64)",
    )
    # Past the answering coordinator's own version, every replica would refuse every call,
    # the one to undo it included (only a write to etcd by hand got the keyspace back).
    code, said = refused(min_coordinator_version="999.0")
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert said.startswith(
        f"min_coordinator_version: 999.0 is above this coordinator's own version "
        f"{coordinator.__version__}: every replica, this one included, would refuse every call"
    )
    _, after = etcd_client.get(Keyspace(prefix).epoch)
    assert after.mod_revision == epoch_meta.mod_revision
    assert VersionStore(coord.store.ctx).read().min_sdk_version == "2.0"
    # Deliberately lowering works.
    reply = _admin(
        coord.target,
        "SetMinimumVersions",
        admin_pb2.SetMinimumVersionsRequest(min_sdk_version="1.9", allow_lower=True),
    )
    assert reply.versions.min_sdk_version == "1.9"


def test_only_admins_may_raise_a_minimum() -> None:
    admin_only = ROLE_TABLE["/coordinator.v1.AdminService/SetMinimumVersions"]
    assert {role.value for role in admin_only} == {"admin"}
