"""Fence-check coverage: every acceptance point, driven over gRPC, validates epoch and
generation in 100% of the operations it accepts; and a point that skips its fence shows up.

Each test gets fresh counters (the metrics are per process), so the numbers are exact.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import generate_latest

from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectState
from coordinator.domain.failures import FailureReport
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import Outcome
from coordinator.metrics import AcceptancePoint, Metrics
from coordinator.store import Store, TaskSpec
from coordinator.store.etcd.ops import Compare, create_revision_is
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from tests.store.support import StoreFactory

W = (("x-coordinator-principal", "w1"),)
X = digest_of(b"payload X")


def claim_over_grpc(
    tasks: tasks_pb2_grpc.TaskServiceStub, worker: worker_pb2_grpc.WorkerServiceStub, tid: str
) -> types_pb2.Fence:
    tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id=tid, input=b"in"))
    response = worker.Claim(
        worker_pb2.ClaimRequest(task_id=tid, scheduler_epoch=1, ttl_seconds=30), metadata=W
    )
    assert response.outcome == types_pb2.OUTCOME_CLAIMED
    return response.fence


def test_every_acceptance_point_validates_every_accepted_operation(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    metrics: Metrics,
) -> None:
    fence = claim_over_grpc(tasks, worker, "t-1")
    ok = types_pb2.OUTCOME_OK
    assert worker.Renew(worker_pb2.RenewRequest(fence=fence), metadata=W).outcome == ok
    authorize = worker_pb2.AuthorizeToolRequest(fence=fence, tool="mail", action="send")
    assert worker.AuthorizeTool(authorize, metadata=W).outcome == ok
    prepare = worker_pb2.PrepareEffectRequest(
        fence=fence, node_id="notify", effect_slot="email", payload_digest=X
    )
    prepared = worker.PrepareEffect(prepare, metadata=W)
    assert prepared.outcome == ok
    record = worker_pb2.RecordEffectRequest(
        fence=fence,
        effect_id=prepared.effect_id,
        state=types_pb2.EFFECT_STATE_COMMITTED,
        external_ref="msg-1",
    )
    assert worker.RecordEffect(record, metadata=W).outcome == ok
    claim_input = digest_of(b"in")
    commit = worker_pb2.CommitRequest(fence=fence, input_digest=claim_input, result=b"r")
    assert worker.Commit(commit, metadata=W).outcome == types_pb2.OUTCOME_COMMITTED
    other = claim_over_grpc(tasks, worker, "t-2")
    assert worker.Release(worker_pb2.ReleaseRequest(fence=other), metadata=W).outcome == ok
    failed = claim_over_grpc(tasks, worker, "t-3")
    fail = worker_pb2.FailRequest(fence=failed, error_code="E", retryable=True)
    assert worker.Fail(fail, metadata=W).outcome == ok
    # Refused operations are not acceptances: a late commit is answered FENCED.
    late = worker_pb2.CommitRequest(fence=other, input_digest=claim_input, result=b"r")
    assert worker.Commit(late, metadata=W).outcome == types_pb2.OUTCOME_FENCED

    stats = admin.GetStats(admin_pb2.GetStatsRequest()).fence_coverage
    counts = {AcceptancePoint(s.point): (s.accepted, s.validated, s.coverage) for s in stats}
    assert counts == {
        AcceptancePoint.CLAIM: (3, 3, 1.0),
        AcceptancePoint.RENEW: (1, 1, 1.0),
        AcceptancePoint.AUTHORIZE: (1, 1, 1.0),
        AcceptancePoint.PREPARE: (1, 1, 1.0),
        AcceptancePoint.RECORD: (1, 1, 1.0),
        AcceptancePoint.COMMIT: (1, 1, 1.0),
        AcceptancePoint.RELEASE: (1, 1, 1.0),
        AcceptancePoint.START_JOB: (0, 0, 1.0),  # managed jobs: tests/jobs/test_rpc.py
        AcceptancePoint.FAIL: (1, 1, 1.0),
    }
    exposition = generate_latest(metrics.registry).decode()
    assert 'coordinator_fence_validated_total{point="prepare"} 1.0' in exposition
    assert 'coordinator_fence_accepted_total{point="claim"} 3.0' in exposition


# --- the mutation check: a point that skips validation is seen -------------------------------


def _without_generation(keys: Keyspace, fence: Fence) -> list[Compare]:
    """A broken fence: the epoch only, no claim or task revision compares."""
    from coordinator.store.fence import epoch_is

    return [epoch_is(keys, fence.scheduler_epoch)]


def _no_epoch(keys: Keyspace, epoch: int) -> Compare:
    """A broken epoch check that always holds."""
    return create_revision_is(keys.prefix + "/never-written", 0)


def _drive(store: Store, point: AcceptancePoint, task_id: str) -> None:
    """Run one accepted operation at ``point`` on a fresh task."""
    store.tasks.create(TaskSpec(task_id=task_id, input=b"in"), by="pm")
    claimed = store.claims.claim(task_id, principal="w1", epoch=1, ttl=30)
    fence = claimed.fence
    assert fence is not None
    if point is AcceptancePoint.FAIL:
        report = FailureReport(retryable=True, code="E")
        assert store.failures.fail(fence, principal="w1", report=report).verdict.accepted
    elif point is AcceptancePoint.RELEASE:
        assert store.acceptance.release(fence, principal="w1", reason="").accepted
    elif point is AcceptancePoint.COMMIT:
        committed = store.acceptance.commit(
            fence,
            principal="w1",
            input_digest=digest_of(b"in"),
            result_digest=digest_of(b"r"),
            result=b"r",
            result_ref="",
        )
        assert committed.verdict.outcome is Outcome.COMMITTED
    elif point is AcceptancePoint.AUTHORIZE:
        assert store.acceptance.authorize_tool(fence, principal="w1", tool="t", action="a").accepted
    elif point in (AcceptancePoint.PREPARE, AcceptancePoint.RECORD):
        prepared = store.effects.prepare(
            fence, principal="w1", node_id="n", effect_slot="s", payload_digest=X
        )
        assert prepared.effect is not None
        if point is AcceptancePoint.RECORD:
            recorded = store.effects.record(
                fence,
                principal="w1",
                effect_id=prepared.effect.effect_id,
                state=EffectState.ABSENT,
                external_ref="",
                etag="",
            )
            assert recorded.verdict.accepted


MUTATIONS = [
    (AcceptancePoint.CLAIM, "coordinator.store.claims.claim_txn", "epoch_is", _no_epoch),
    (
        AcceptancePoint.AUTHORIZE,
        "coordinator.store.attempts.acceptance",
        "fence_compares",
        _without_generation,
    ),
    (
        AcceptancePoint.PREPARE,
        "coordinator.store.effects.effect",
        "fence_compares",
        _without_generation,
    ),
    # Fail's, Release's and Commit's fence compares are built by the move that ends a held
    # attempt (store/transition.py::held_transition_ops), their only compare of the task key.
    (
        AcceptancePoint.FAIL,
        "coordinator.store.transition",
        "fence_compares",
        _without_generation,
    ),
    (
        AcceptancePoint.RELEASE,
        "coordinator.store.transition",
        "fence_compares",
        _without_generation,
    ),
    (
        AcceptancePoint.COMMIT,
        "coordinator.store.transition",
        "fence_compares",
        _without_generation,
    ),
    (
        AcceptancePoint.RECORD,
        "coordinator.store.effects.effect",
        "fence_compares",
        _without_generation,
    ),
]


@pytest.mark.parametrize(
    ("point", "module", "name", "broken"), MUTATIONS, ids=[m[0].name for m in MUTATIONS]
)
def test_a_point_that_skips_its_fence_drops_below_full_coverage(
    make_store: StoreFactory,
    monkeypatch: pytest.MonkeyPatch,
    point: AcceptancePoint,
    module: str,
    name: str,
    broken: Any,
) -> None:
    store = make_store()
    _drive(store, point, "t-ok")
    assert (_counts(store, point), _coverage(store, point)) == ((1, 1), 1.0)
    monkeypatch.setattr(f"{module}.{name}", broken)
    _drive(store, point, "t-broken")  # still accepted: nothing else stops it
    assert (_counts(store, point), _coverage(store, point)) == ((2, 1), 0.5)


def _counts(store: Store, point: AcceptancePoint) -> tuple[int, int]:
    entry = next(c for c in store.ctx.metrics.fence_coverage() if c.point is point)
    return entry.accepted, entry.validated


def _coverage(store: Store, point: AcceptancePoint) -> float:
    return next(c.coverage for c in store.ctx.metrics.fence_coverage() if c.point is point)
