"""Fixtures of the console tests: a real coordinator that demands bearer tokens (on the
session etcd, this test's own prefix), and a real ``coordinator console`` process in front of
it on a free port."""

from __future__ import annotations

import re
import secrets
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from coordinator.sdk import Claim, Outcome, RetryPolicy, TaskState, WorkerClient
from coordinator.server import build_server
from coordinator.server.auth import TokenAuth
from coordinator.server.tokens import TokenFile
from coordinator.store import Store
from coordinator.v1 import tasks_pb2_grpc, worker_pb2_grpc
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS
from tests.test_cli import Process

pytest.importorskip("starlette", reason="the console extra is not installed")

ROLES = {
    "worker-a": ["worker"],
    "pm-1": ["pm"],
    "pm-2": ["pm"],
    "admin-1": ["admin"],
}


@dataclass
class Stack:
    """The coordinator, its tokens, and the console in front of it."""

    target: str
    ring: TokenRing
    url: str

    def client(self, principal: str) -> WorkerClient:
        """An SDK client with ``principal``'s token."""
        return WorkerClient(
            self.target,
            principal=principal,
            token=self.ring.tokens[principal],
            channel_options=GRPC_OPTIONS,
            retry=RetryPolicy(attempts=3),
        )

    def token(self, principal: str) -> str:
        """``principal``'s bearer token."""
        return self.ring.tokens[principal]

    @contextmanager
    def stubs(self, principal: str) -> Iterator[Stubs]:
        """Raw gRPC stubs and ``principal``'s token metadata (for calls the SDK has no verb
        for: reject, prepare an effect, ...)."""
        with grpc.insecure_channel(self.target, options=GRPC_OPTIONS) as channel:
            yield Stubs(
                tasks=tasks_pb2_grpc.TaskServiceStub(channel),
                worker=worker_pb2_grpc.WorkerServiceStub(channel),
                metadata=self.ring.metadata(principal),
            )

    def state(self, task_id: str) -> tuple[TaskState, int]:
        """The task's state and revision, read from the coordinator."""
        with self.client("pm-1") as pm:
            task = pm.get_task(task_id)
        return task.state, task.revision

    def commit(self, task_id: str, result: bytes) -> None:
        """worker-a claims ``task_id`` and commits ``result``."""
        with self.client("worker-a") as worker:
            claim = worker.claim(task_id, ttl=timedelta(seconds=30))
            assert isinstance(claim, Claim), claim
            with claim:
                assert claim.commit(result).outcome is Outcome.COMMITTED

    def review_task(self, task_id: str, result: bytes = b"the report") -> None:
        """A task in REVIEW at revision 1 (created by pm-1, committed by worker-a)."""
        with self.client("pm-1") as pm:
            pm.create_task(task_id, queue="q", input=b"draft", requires_review=True)
        self.commit(task_id, result)


@dataclass
class Stubs:
    """gRPC stubs and the metadata that carries one principal's token."""

    tasks: tasks_pb2_grpc.TaskServiceStub
    worker: worker_pb2_grpc.WorkerServiceStub
    metadata: tuple[tuple[str, str], ...]


@pytest.fixture
def ring(tmp_path: Path) -> TokenRing:
    """One token per principal of ROLES."""
    ring = TokenRing(tmp_path / "tokens.json")
    for principal, roles in ROLES.items():
        ring.issue(principal, roles)
    return ring


@pytest.fixture
def coordinator(store: Store, ring: TokenRing) -> Iterator[str]:
    """A coordinator server that authenticates with ``ring``; yields its target."""
    auth = TokenAuth(TokenFile(ring.path, reload_interval=0.0))
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=16, auth=auth)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()


@pytest.fixture
def stack(coordinator: str, ring: TokenRing, tmp_path: Path) -> Iterator[Stack]:
    """``coordinator console`` on a free loopback port, for ``coordinator``."""
    secret = tmp_path / "console-secret"
    secret.write_text(secrets.token_urlsafe(48))
    process = Process(
        [
            "console",
            "--target",
            coordinator,
            "--listen",
            "127.0.0.1:0",
            "--secret-file",
            str(secret),
        ],
        tmp_path / "console.log",
        env={"COORDINATOR_INSECURE": ""},
    )
    try:
        match = process.expect(r"on (http://\S+?)/?$")
        yield Stack(coordinator, ring, match.group(1).rstrip("/"))
        # uvicorn re-raises SIGTERM after a graceful shutdown: the conventional -15.
        assert process.terminate() in (0, -signal.SIGTERM), process.logs()
    finally:
        process.kill()


def flash_text(html: str) -> str:
    """The outcome line of a page (the flash), or ""."""
    found = re.search(r'id="flash">([^<]*)<', html)
    return found.group(1) if found else ""
