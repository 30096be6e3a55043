"""A request is parsed in one place: every servicer method calls at most one ``parse_*``, the
``parse_<rpc>`` of its service's requests module, and every RPC whose request has fields has
one. Read from the source with ``ast`` (no server)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType

import pytest

from coordinator.server.wire import admin_requests, task_requests, worker_requests
from coordinator.v1 import admin_pb2, tasks_pb2, worker_pb2

SERVICES = Path(__file__).resolve().parents[2] / "coordinator" / "server" / "services"
CASES = [
    ("worker_service.py", worker_pb2, "WorkerService", worker_requests),
    ("task_service.py", tasks_pb2, "TaskService", task_requests),
    ("admin_service.py", admin_pb2, "AdminService", admin_requests),
]


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _parse_calls(method: ast.FunctionDef) -> list[str]:
    calls = []
    for node in ast.walk(method):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name.startswith("parse_") or name in {"task_id", "non_negative"}:
                owner = func.value if isinstance(func, ast.Attribute) else None
                calls.append(f"{owner.id if isinstance(owner, ast.Name) else ''}.{name}")
    return calls


@pytest.mark.parametrize(("source", "pb2", "service", "module"), CASES)
def test_each_rpc_is_parsed_by_its_one_parse_function(
    source: str, pb2: ModuleType, service: str, module: ModuleType
) -> None:
    tree = ast.parse((SERVICES / source).read_text())
    methods = {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name[:1].isupper()
    }
    wrong: dict[str, object] = {}
    for rpc in pb2.DESCRIPTOR.services_by_name[service].methods:
        expected = f"parse_{_snake(rpc.name)}"
        calls = _parse_calls(methods[rpc.name])
        has_fields = bool(rpc.input_type.fields)
        if calls != ([f"requests.{expected}"] if has_fields else []):
            wrong[rpc.name] = calls
        if has_fields and not hasattr(module, expected):
            wrong[rpc.name] = f"{module.__name__}.{expected} is missing"
    assert wrong == {}
