"""Fixtures of the console tests: a coordinator that demands bearer tokens (on the session
etcd, this test's own prefix) and a real ``coordinator console`` process in front of it on a
free port.

``coordinator`` is an in-process server (the HTTP tests, and the one that needs the store's
hands to make events share a revision); ``served_coordinator`` is a real ``coordinator serve
--token-file`` process, which the browser tests use instead (they override ``coordinator``)."""

from __future__ import annotations

import json
import re
import secrets
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from coordinator.domain.digests import digest_of
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import CallRetry, Claim, Outcome, TaskState, WorkerClient
from coordinator.server import build_server
from coordinator.server.interceptors.auth import TokenAuth
from coordinator.server.tokens import TokenFile
from coordinator.store import Store
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
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
            retry=CallRetry(attempts=3),
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
                admin=admin_pb2_grpc.AdminServiceStub(channel),
                metadata=self.ring.metadata(principal),
            )

    def state(self, task_id: str) -> tuple[TaskState, int]:
        """The task's state and revision, read from the coordinator."""
        with self.client("pm-1") as pm:
            task = pm.get_task(task_id)
        return task.state, task.revision

    def commit(self, task_id: str, result: bytes) -> int:
        """worker-a claims ``task_id`` and commits ``result``; returns the claim generation."""
        with self.client("worker-a") as worker:
            claim = worker.claim(task_id, ttl=timedelta(seconds=30))
            assert isinstance(claim, Claim), claim
            with claim:
                assert claim.commit(result).outcome is Outcome.COMMITTED
            return claim.generation

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
    admin: admin_pb2_grpc.AdminServiceStub
    metadata: tuple[tuple[str, str], ...]

    def claim(self, task_id: str, *, ttl: int = 30) -> worker_pb2.ClaimResponse:
        """Claim ``task_id`` (no keepalive: the lease runs down unless renewed)."""
        epoch = self.admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=self.metadata).epoch
        request = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=epoch, ttl_seconds=ttl)
        reply = self.worker.Claim(request, metadata=self.metadata)
        assert reply.outcome == types_pb2.OUTCOME_CLAIMED, reply.message
        return reply

    def effect(
        self,
        fence: types_pb2.Fence,
        slot: str,
        state: types_pb2.EffectState.ValueType | None = None,
    ) -> str:
        """Prepare the effect ``notify/slot`` under ``fence`` and, with ``state``, record it;
        returns its id."""
        prepared = self.worker.PrepareEffect(
            worker_pb2.PrepareEffectRequest(
                fence=fence, node_id="notify", effect_slot=slot, payload_digest=digest_of(b"m")
            ),
            metadata=self.metadata,
        )
        assert prepared.outcome == types_pb2.OUTCOME_OK, prepared.message
        if state is not None:
            recorded = self.worker.RecordEffect(
                worker_pb2.RecordEffectRequest(
                    fence=fence, effect_id=prepared.effect_id, state=state
                ),
                metadata=self.metadata,
            )
            assert recorded.outcome == types_pb2.OUTCOME_OK, recorded.message
        return str(prepared.effect_id)


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
def served_coordinator(
    etcd: EtcdProcess, prefix: str, ring: TokenRing, tmp_path: Path
) -> Iterator[str]:
    """A real ``coordinator serve --token-file`` process on this test's prefix of the session
    etcd, on free ports; yields its target."""
    process = Process(
        [
            "serve",
            "--etcd",
            etcd.endpoint,
            "--prefix",
            prefix,
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--token-file",
            str(ring.path),
            # A released task is claimable again at once (the pages, not retry timing, are
            # under test; the default backoff would make it DELAYED for a second and more).
            "--retry-initial-backoff",
            "0",
        ],
        tmp_path / "serve.log",
        env={"COORDINATOR_INSECURE": "", "COORDINATOR_CONFIG": ""},
    )
    try:
        yield eventually(
            lambda: _serving_address(process), timeout=30, message="serve did not start"
        )
        assert process.terminate() == 0, process.logs()
    finally:
        process.kill()


def _serving_address(process: Process) -> str | None:
    """The address in serve's JSON "serving" log line (it prints nothing on stdout)."""
    assert process.proc.poll() is None, process.logs()
    for line in process.logs().splitlines():
        if line.startswith("{") and '"serving"' in line:
            record = json.loads(line)
            if record.get("event") == "serving":
                return str(record["listen"])
    return None


@contextmanager
def console_process(args: Sequence[str], tmp_path: Path) -> Iterator[str]:
    """``coordinator console ARGS`` on a free loopback port; yields its URL."""
    secret = tmp_path / "console-secret"
    secret.write_text(secrets.token_urlsafe(48))
    process = Process(
        ["console", *args, "--listen", "127.0.0.1:0", "--secret-file", str(secret)],
        tmp_path / "console.log",
        env={"COORDINATOR_INSECURE": "", "COORDINATOR_TARGET": ""},
    )
    try:
        match = process.expect(r"on (http://\S+?)/?$")
        yield match.group(1).rstrip("/")
        # uvicorn re-raises SIGTERM after a graceful shutdown: the conventional -15.
        assert process.terminate() in (0, -signal.SIGTERM), process.logs()
    finally:
        process.kill()


@pytest.fixture
def stack(coordinator: str, ring: TokenRing, tmp_path: Path) -> Iterator[Stack]:
    """``coordinator console`` on a free loopback port, for ``coordinator``."""
    with console_process(["--target", coordinator], tmp_path) as url:
        yield Stack(coordinator, ring, url)


def flash_text(html: str) -> str:
    """The outcome line of a page (the flash), or ""."""
    found = re.search(r'id="flash">([^<]*)<', html)
    return found.group(1) if found else ""
