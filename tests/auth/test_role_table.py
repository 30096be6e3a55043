"""The role table is complete (fail closed only ever refuses what nobody decided about), the
security doc (docs/security.md) shows the same table, and a method missing from it is refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from coordinator.domain.roles import Role
from coordinator.server import SERVICE_NAMES
from coordinator.server.interceptors import auth as auth_module
from coordinator.server.interceptors.auth import ROLE_TABLE
from coordinator.v1 import admin_pb2, admin_pb2_grpc, tasks_pb2, types_pb2, worker_pb2
from tests.auth.conftest import TokenRing, status_of

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
_PROTO_MODULES = (worker_pb2, tasks_pb2, admin_pb2, types_pb2)


def _methods() -> Iterator[str]:
    """``/package.Service/Method`` of every method of every generated service."""
    for module in _PROTO_MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                yield f"/{service.full_name}/{method.name}"


def test_every_method_of_every_service_is_in_the_table() -> None:
    methods = set(_methods())
    services = {m.split("/")[1] for m in methods}
    assert services == set(SERVICE_NAMES), "a generated service is not served (or vice versa)"
    missing = sorted(methods - set(ROLE_TABLE))
    assert missing == [], (
        f"add these to ROLE_TABLE in coordinator/server/interceptors/auth.py: {missing}"
    )
    assert all(ROLE_TABLE[m] for m in methods), "a method that no role may call"


def test_the_security_doc_shows_the_same_table() -> None:
    text = SECURITY_DOC.read_text(encoding="utf-8")
    section = text.split("## Who may call what", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `(\w+)\.(\w+)` \|(.*)\|\s*$", section, flags=re.MULTILINE)
    documented = {
        f"/coordinator.v1.{service}/{method}": frozenset(
            role
            for role, mark in zip(Role, (c.strip() for c in cells.split("|")), strict=True)
            if mark
        )
        for service, method, cells in rows
    }
    assert documented == dict(ROLE_TABLE)


def test_a_method_missing_from_the_table_is_refused(
    ring: TokenRing, channel: grpc.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = dict(ROLE_TABLE)
    del table["/coordinator.v1.AdminService/GetEpoch"]
    monkeypatch.setattr(auth_module, "ROLE_TABLE", table)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("admin-1"))
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "no entry in the role table" in (info.value.details() or "")
    # Its neighbours still work: only the missing method is closed.
    status = admin.DrainStatus(admin_pb2.DrainStatusRequest(), metadata=ring.metadata("admin-1"))
    assert status.epoch == 1
    assert status_of(
        lambda: admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("worker-a"))
    ) == (grpc.StatusCode.PERMISSION_DENIED)
