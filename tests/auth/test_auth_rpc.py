"""Every refusal of the auth interceptor, over a real gRPC channel with bearer tokens: no token,
a wrong token, a wrong role, a foreign owner, a revoked or expired token after a reload. Each
refused call must leave the keyspace exactly as it was."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.domain.digests import digest_of
from coordinator.errors import PermissionDenied, Unauthenticated
from coordinator.sdk import CallRetry, ClaimRefused, WorkerClient
from coordinator.server.tokens import token_hash
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.auth.conftest import TokenRing, status_of
from tests.conftest import GRPC_OPTIONS

INPUT = b"input"
RESULT = b"result"
Probe = Callable[[], tuple[int, int]]
Metadata = tuple[tuple[str, str], ...]


def _stubs(
    channel: grpc.Channel,
) -> tuple[
    worker_pb2_grpc.WorkerServiceStub,
    tasks_pb2_grpc.TaskServiceStub,
    admin_pb2_grpc.AdminServiceStub,
]:
    return (
        worker_pb2_grpc.WorkerServiceStub(channel),
        tasks_pb2_grpc.TaskServiceStub(channel),
        admin_pb2_grpc.AdminServiceStub(channel),
    )


def _create(ring: TokenRing, channel: grpc.Channel, task_id: str = "t-1") -> None:
    tasks = tasks_pb2_grpc.TaskServiceStub(channel)
    tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id=task_id, input=INPUT), metadata=ring.metadata("pm-1")
    )


def _claim(ring: TokenRing, channel: grpc.Channel, principal: str) -> worker_pb2.ClaimResponse:
    worker, _, admin = _stubs(channel)
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata(principal)).epoch
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=epoch, ttl_seconds=30),
        metadata=ring.metadata(principal),
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED, claim.message
    return claim


def test_a_call_without_a_token_is_unauthenticated_and_writes_nothing(
    ring: TokenRing, channel: grpc.Channel, keyspace: Probe
) -> None:
    worker, tasks, admin = _stubs(channel)
    _create(ring, channel)
    before = keyspace()
    calls = {
        "create": lambda: tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t-2")),
        "claim": lambda: worker.Claim(
            worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30)
        ),
        "bump": lambda: admin.BumpEpoch(admin_pb2.BumpEpochRequest()),
        "get": lambda: tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1")),
        # Naming a principal is not authenticating as it (that is insecure mode only).
        "named": lambda: worker.Claim(
            worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30),
            metadata=(("x-coordinator-principal", "worker-a"),),
        ),
    }
    codes = {name: status_of(call) for name, call in calls.items()}
    assert codes == dict.fromkeys(calls, grpc.StatusCode.UNAUTHENTICATED)
    assert keyspace() == before


@pytest.mark.parametrize(
    "authorization",
    ["Bearer not-a-known-token", "Basic d29ya2VyLWE6cHc=", "Bearer ", "bearer"],
)
def test_a_wrong_token_is_unauthenticated(
    ring: TokenRing, channel: grpc.Channel, keyspace: Probe, authorization: str
) -> None:
    _, tasks, _ = _stubs(channel)
    before = keyspace()
    with pytest.raises(grpc.RpcError) as info:
        tasks.CreateTask(
            tasks_pb2.CreateTaskRequest(task_id="t-1", input=INPUT),
            metadata=(("authorization", authorization),),
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "token" in (info.value.details() or "").lower() or "Bearer" in (
        info.value.details() or ""
    )
    assert keyspace() == before


def test_each_role_reaches_only_its_methods(
    ring: TokenRing, channel: grpc.Channel, keyspace: Probe
) -> None:
    worker, tasks, admin = _stubs(channel)
    _create(ring, channel)
    claim = worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30)
    before = keyspace()
    denied: dict[tuple[str, str], Callable[[Metadata], object]] = {
        ("worker-a", "CreateTask"): lambda m: tasks.CreateTask(
            tasks_pb2.CreateTaskRequest(task_id="t-2"), metadata=m
        ),
        ("worker-a", "CancelTask"): lambda m: tasks.CancelTask(
            tasks_pb2.CancelTaskRequest(task_id="t-1"), metadata=m
        ),
        ("worker-a", "BumpEpoch"): lambda m: admin.BumpEpoch(
            admin_pb2.BumpEpochRequest(), metadata=m
        ),
        ("worker-a", "PauseClaims"): lambda m: admin.PauseClaims(
            admin_pb2.PauseClaimsRequest(), metadata=m
        ),
        ("worker-a", "DrainStatus"): lambda m: admin.DrainStatus(
            admin_pb2.DrainStatusRequest(), metadata=m
        ),
        ("pm-1", "Claim"): lambda m: worker.Claim(claim, metadata=m),
        ("pm-1", "BumpEpoch"): lambda m: admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=m),
        ("admin-1", "Claim"): lambda m: worker.Claim(claim, metadata=m),
    }
    codes = {key: status_of(partial(call, ring.metadata(key[0]))) for key, call in denied.items()}
    assert codes == dict.fromkeys(denied, grpc.StatusCode.PERMISSION_DENIED)
    assert keyspace() == before

    # And each may call what the table grants it.
    assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("worker-a")).epoch
    got = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"), metadata=ring.metadata("worker-a"))
    assert got.task.task_id == "t-1"
    assert (
        worker.Claim(claim, metadata=ring.metadata("worker-a")).outcome == types_pb2.OUTCOME_CLAIMED
    )
    drain = admin.DrainStatus(admin_pb2.DrainStatusRequest(), metadata=ring.metadata("pm-1"))
    assert drain.active_leases == 1
    # One effect by its id is a read, as a line of ListEffects (open to every role) is: a pm
    # was refused `coordinator effects show` for what `effects list` showed it.
    missing = worker_pb2.GetEffectRequest(effect_id="eff-" + "0" * 64)
    for who in ("pm-1", "admin-1"):
        read = partial(worker.GetEffect, missing, metadata=ring.metadata(who))
        assert status_of(read) == grpc.StatusCode.NOT_FOUND, who
    bumped = admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=ring.metadata("admin-1"))
    assert bumped.epoch == 2


def test_the_denial_names_the_principal_its_roles_and_the_allowed_roles(
    ring: TokenRing, channel: grpc.Channel
) -> None:
    _, _, admin = _stubs(channel)
    with pytest.raises(grpc.RpcError) as info:
        admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=ring.metadata("pm-1"))
    assert info.value.details() == (
        "principal 'pm-1' (roles: pm) may not call /coordinator.v1.AdminService/BumpEpoch; "
        "allowed roles: admin"
    )


def test_the_claim_owner_is_the_token_principal_whatever_the_metadata_says(
    ring: TokenRing, channel: grpc.Channel
) -> None:
    worker, tasks, _ = _stubs(channel)
    _create(ring, channel)
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=1, ttl_seconds=30),
        metadata=(*ring.metadata("worker-a"), ("x-coordinator-principal", "worker-b")),
    )
    assert claim.outcome == types_pb2.OUTCOME_CLAIMED
    task = tasks.GetTask(
        tasks_pb2.GetTaskRequest(task_id="t-1"), metadata=ring.metadata("pm-1")
    ).task
    assert task.owner_id == "worker-a"


def test_a_foreign_owner_is_denied_at_every_acceptance_point_and_nothing_changes(
    ring: TokenRing, channel: grpc.Channel, keyspace: Probe
) -> None:
    worker, tasks, _ = _stubs(channel)
    _create(ring, channel)
    fence = _claim(ring, channel, "worker-a").fence
    prepared = worker.PrepareEffect(
        worker_pb2.PrepareEffectRequest(
            fence=fence, node_id="n1", effect_slot="email", payload_digest=digest_of(b"x")
        ),
        metadata=ring.metadata("worker-a"),
    )
    assert prepared.outcome == types_pb2.OUTCOME_OK, prepared.message
    before = keyspace()
    digest = digest_of(RESULT)
    foreign: dict[str, Callable[[Metadata], Any]] = {
        "renew": lambda m: worker.Renew(worker_pb2.RenewRequest(fence=fence), metadata=m),
        "authorize": lambda m: worker.AuthorizeTool(
            worker_pb2.AuthorizeToolRequest(fence=fence, tool="git", action="push"), metadata=m
        ),
        "stage": lambda m: worker.StageResult(
            worker_pb2.StageResultRequest(fence=fence, result_digest=digest, result=RESULT),
            metadata=m,
        ),
        "prepare": lambda m: worker.PrepareEffect(
            worker_pb2.PrepareEffectRequest(
                fence=fence, node_id="n1", effect_slot="email", payload_digest=digest_of(b"x")
            ),
            metadata=m,
        ),
        "record": lambda m: worker.RecordEffect(
            worker_pb2.RecordEffectRequest(
                fence=fence,
                effect_id=prepared.effect.effect_id,
                state=types_pb2.EFFECT_STATE_COMMITTED,
                external_ref="msg-1",
            ),
            metadata=m,
        ),
        "commit": lambda m: worker.Commit(
            worker_pb2.CommitRequest(
                fence=fence, input_digest=digest_of(INPUT), result_digest=digest, result=RESULT
            ),
            metadata=m,
        ),
        "release": lambda m: worker.Release(worker_pb2.ReleaseRequest(fence=fence), metadata=m),
    }
    codes = {
        name: status_of(partial(call, ring.metadata("worker-b"))) for name, call in foreign.items()
    }
    assert codes == dict.fromkeys(foreign, grpc.StatusCode.PERMISSION_DENIED)
    assert keyspace() == before
    # The real holder is unaffected.
    commit = foreign["commit"](ring.metadata("worker-a"))
    assert commit.outcome == types_pb2.OUTCOME_COMMITTED, commit.message
    task = tasks.GetTask(tasks_pb2.GetTaskRequest(task_id="t-1"), metadata=ring.metadata("pm-1"))
    assert task.task.owner_id == "worker-a"


def test_a_revoked_token_is_refused_after_reload_and_a_new_one_accepted(
    ring: TokenRing, channel: grpc.Channel
) -> None:
    _, _, admin = _stubs(channel)
    old = ring.metadata("worker-a")
    assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=old).epoch == 1

    ring.revoke("worker-a")
    assert status_of(lambda: admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=old)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    ring.issue("worker-c", ["worker"])
    assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("worker-c")).epoch
    # Other holders were never interrupted by the reload.
    assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("worker-b")).epoch


def test_a_role_change_takes_effect_after_reload(ring: TokenRing, channel: grpc.Channel) -> None:
    _, _, admin = _stubs(channel)
    metadata = ring.metadata("pm-1")
    assert status_of(lambda: admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=metadata)) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    ring.roles["pm-1"] = ["pm", "admin"]
    ring.write()
    assert admin.BumpEpoch(admin_pb2.BumpEpochRequest(), metadata=metadata).epoch == 2


def test_an_expired_token_is_refused(ring: TokenRing, channel: grpc.Channel) -> None:
    _, _, admin = _stubs(channel)
    now = datetime.now(UTC)
    entries = {
        token_hash("expired-token"): {
            "principal": "late",
            "roles": ["worker"],
            "expires_at": (now - timedelta(seconds=1)).isoformat(),
        },
        token_hash("current-token"): {
            "principal": "early",
            "roles": ["worker"],
            "expires_at": (now + timedelta(hours=1)).isoformat(),
        },
    }
    ring.write(tokens=entries)
    with pytest.raises(grpc.RpcError) as info:
        admin.GetEpoch(
            admin_pb2.GetEpochRequest(), metadata=(("authorization", "Bearer expired-token"),)
        )
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (info.value.details() or "")
    current = (("authorization", "Bearer current-token"),)
    assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=current).epoch == 1


def test_a_broken_token_file_keeps_the_previous_one_in_force(
    ring: TokenRing, channel: grpc.Channel
) -> None:
    _, _, admin = _stubs(channel)
    ring.path.write_text('{"tokens": {"oops": ', encoding="utf-8")
    # Still served from the last good file: a typo must not lock everyone out...
    assert admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=ring.metadata("worker-a")).epoch
    # ...and the next good file (here: a revocation) takes effect.
    revoked = ring.metadata("worker-a")
    ring.revoke("worker-a")
    assert status_of(lambda: admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=revoked)) == (
        grpc.StatusCode.UNAUTHENTICATED
    )


def test_health_needs_no_token(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_sdk_sends_its_token(secured: str, ring: TokenRing) -> None:
    def client(token: str | None, principal: str = "ignored") -> WorkerClient:
        return WorkerClient(
            secured,
            principal=principal,
            token=token,
            channel_options=GRPC_OPTIONS,
            retry=CallRetry(attempts=1),
        )

    with client(ring.tokens["pm-1"]) as producer:
        producer.create_task("t-1", input=INPUT)
    with client(ring.tokens["worker-a"], principal="worker-b") as worker:
        job = worker.claim("t-1", ttl=timedelta(seconds=30))
        assert not isinstance(job, ClaimRefused)
        with job:
            assert job.commit(RESULT).outcome.name == "COMMITTED"
        assert worker.get_task("t-1").owner_id == "worker-a"  # the token's, not the argument
        with pytest.raises(PermissionDenied):
            worker.create_task("t-2", input=INPUT)
    with client(None) as anonymous, pytest.raises(Unauthenticated):
        anonymous.epoch()
