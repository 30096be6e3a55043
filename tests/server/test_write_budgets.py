"""Per-principal write budgets over a real server and etcd: a caller past its budget is refused
typed (its growth calls) or keeps its claim without the checkpoint (its renewals), while other
principals write on."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from prometheus_client import CollectorRegistry

from coordinator.domain.digests import digest_of
from coordinator.domain.failures import KEPT_MESSAGE
from coordinator.domain.roles import Role
from coordinator.domain.write_budget import BudgetPolicy
from coordinator.server import build_server
from coordinator.store import Store, TaskSpec
from coordinator.store.control.idempotency import LARGE_TTL
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
from tests.helpers import Probe, refused

# 1 byte/s over 10,000 s: a 10,000-byte budget that refills nothing a test would notice.
BUDGETS = {
    Role.WORKER: BudgetPolicy(rate=1.0, window=10_000.0),
    Role.PM: BudgetPolicy(rate=1.0, window=10_000.0),
}
PM_A = (("x-coordinator-principal", "pm-a"), ("x-coordinator-roles", "pm"))
PM_B = (("x-coordinator-principal", "pm-b"), ("x-coordinator-roles", "pm"))
WORKER = (("x-coordinator-principal", "worker-a"), ("x-coordinator-roles", "worker"))
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture
def channel(store: Store) -> Iterator[grpc.Channel]:
    """A channel to a server with the test's write budgets."""
    srv, port = build_server(
        store, listen="127.0.0.1:0", max_workers=8, health_interval=0.2, write_budgets=BUDGETS
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as chan:
            yield chan
    finally:
        srv.stop(grace=None).wait()


def _create(task_id: str, size: int) -> tasks_pb2.CreateTaskRequest:
    data = task_id.encode().ljust(size, b".")
    return tasks_pb2.CreateTaskRequest(task_id=task_id, input=data, input_digest=digest_of(data))


def test_a_producer_past_its_budget_is_refused_and_another_is_not(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe, store: Store
) -> None:
    tasks.CreateTask(_create("a-1", 6000), metadata=PM_A)
    refused(
        tasks.CreateTask, _create("a-2", 6000), EXHAUSTED, "retry after", keyspace, metadata=PM_A
    )
    refused(
        tasks.CreateTask,
        _create("a-3", 6000),
        EXHAUSTED,
        "write budget of 'pm-a' (1 bytes/s over 10000 s, write_budget_pm) is spent",
        keyspace,
        metadata=PM_A,
    )
    tasks.CreateTask(_create("b-1", 6000), metadata=PM_B)  # a budget is per principal
    registry: CollectorRegistry = store.ctx.metrics.registry
    refusals = registry.get_sample_value(
        "coordinator_write_budget_refusals_total", {"what": "input"}
    )
    assert refusals == 2


def test_a_worker_past_its_budget_keeps_its_claim_without_the_checkpoint(
    tasks: tasks_pb2_grpc.TaskServiceStub,
    worker: worker_pb2_grpc.WorkerServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    keyspace: Probe,
) -> None:
    tasks.CreateTask(_create("t-1", 10), metadata=PM_A)
    epoch = admin.GetEpoch(admin_pb2.GetEpochRequest()).epoch
    claim = worker.Claim(
        worker_pb2.ClaimRequest(task_id="t-1", scheduler_epoch=epoch, ttl_seconds=30),
        metadata=WORKER,
    )
    fence = claim.fence
    result = b"r" * 6000
    stage = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(result), result=result
    )
    assert worker.StageResult(stage, metadata=WORKER).outcome == types_pb2.OUTCOME_OK
    refused(worker.StageResult, stage, EXHAUSTED, "write_budget_worker", keyspace, metadata=WORKER)

    before = keyspace()
    checkpoint = worker_pb2.RenewRequest(fence=fence, checkpoint=b"c" * 6000)
    many = worker.RenewMany(worker_pb2.RenewManyRequest(renewals=[checkpoint]), metadata=WORKER)
    [answer] = many.results
    assert answer.renewal.outcome == types_pb2.OUTCOME_OK and answer.renewal.ttl_seconds > 0
    assert "write budget of 'worker-a'" in answer.renewal.checkpoint_refused
    assert keyspace() == before  # the checkpoint was not written
    huge = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(b"h" * 20_000), result=b"h" * 20_000
    )
    refused(
        worker.StageResult, huge, EXHAUSTED, "more than a whole window", keyspace, metadata=WORKER
    )


def test_a_replay_of_a_keyed_create_is_answered_not_charged_again(
    tasks: tasks_pb2_grpc.TaskServiceStub,
) -> None:
    keyed = (*PM_A, ("idempotency-key", "create-k-1"))
    first = tasks.CreateTask(_create("k-1", 6000), metadata=keyed)
    again = tasks.CreateTask(_create("k-1", 6000), metadata=keyed)  # ~600 bytes left: a replay
    assert again.task.task_id == first.task.task_id == "k-1"
    assert again == first


def test_a_keyed_answer_is_charged_kept_briefly_when_large_and_past_the_budget_not_kept(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store
) -> None:
    # A cancel's answer carries the task's input, which its request did not: stored under
    # a fresh key per call, such answers once filled etcd from one producer token (350 KB a
    # call, 1.4 GiB in a minute, uncharged and kept a day).
    tasks.CreateTask(_create("big", 6000), metadata=PM_A)
    tasks.CancelTask(tasks_pb2.CancelTaskRequest(task_id="big"), metadata=PM_A)
    answers = [
        tasks.CancelTask(
            tasks_pb2.CancelTaskRequest(task_id="big"),
            metadata=(*PM_B, ("idempotency-key", f"cancel-{n}")),
        )
        for n in (1, 2)
    ]
    assert [a.task.state for a in answers] == [types_pb2.TASK_STATE_CANCELLED] * 2
    assert len(answers[0].task.input) == 6000  # an answer of ~6 KB: charged, pm-b's 10 KB fit one
    kv = store.ctx.kv
    kept = kv.get(store.ctx.keys.idem("pm-b", "cancel-1"))
    assert kept is not None
    [lease] = kv.lease_readings([kept.lease])
    assert lease is not None and lease.granted <= LARGE_TTL * 1.02 + 1  # not the day's
    assert kv.get(store.ctx.keys.idem("pm-b", "cancel-2")) is None  # past the budget: not kept
    registry: CollectorRegistry = store.ctx.metrics.registry
    refusals = registry.get_sample_value(
        "coordinator_write_budget_refusals_total", {"what": "stored_answer"}
    )
    assert refusals == 1
    # The replay of the kept one is its answer; the other key runs again (a cancel repeats).
    replay = tasks.CancelTask(
        tasks_pb2.CancelTaskRequest(task_id="big"),
        metadata=(*PM_B, ("idempotency-key", "cancel-1")),
    )
    assert replay == answers[0]


def test_a_worker_past_its_budget_prepares_no_effect_and_fails_without_the_details(
    worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe, store: Store
) -> None:
    store.tasks.create(TaskSpec(task_id="w-1", input=b"x"), by="pm")
    claim = worker_pb2.ClaimRequest(task_id="w-1", scheduler_epoch=1, ttl_seconds=30)
    fence = worker.Claim(claim, metadata=WORKER).fence
    result = b"r" * 6_300  # stored base64 with its key: all but 576 bytes of the budget
    stage = worker_pb2.StageResultRequest(
        fence=fence, result_digest=digest_of(result), result=result
    )
    worker.StageResult(stage, metadata=WORKER)
    prepare = worker_pb2.PrepareEffectRequest(
        fence=fence, node_id="notify", effect_slot="email", payload_digest=digest_of(b"p")
    )
    refused(
        worker.PrepareEffect, prepare, EXHAUSTED, "write budget of 'worker-a'", keyspace,
        metadata=WORKER,
    )  # fmt: skip
    fail = worker_pb2.FailRequest(
        fence=fence,
        retryable=True,
        error_code="E",
        error_message="m" * 1000,
        error_details=b"d" * 16384,
    )
    assert worker.Fail(fail, metadata=WORKER).outcome == types_pb2.OUTCOME_OK
    (attempt,) = store.tasks.attempts("w-1")
    assert (attempt.error_code, attempt.error_details) == ("E", b"")
    assert attempt.error_message == "m" * KEPT_MESSAGE
    registry: CollectorRegistry = store.ctx.metrics.registry
    refusals = [
        registry.get_sample_value("coordinator_write_budget_refusals_total", {"what": what})
        for what in ("effect", "failure_details")
    ]
    assert refusals == [1, 1]


def test_a_worker_past_its_budget_records_no_long_reference_and_another_worker_records_on(
    worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe, store: Store
) -> None:
    """RecordEffect is charged its text: a worker that spent its budget on slots is refused
    recording a 2 KB reference (typed, the effect still PREPARED: the SDK retries it once the
    budget refills, within the lease), while another worker's record of the same size lands."""
    other = (("x-coordinator-principal", "worker-b"), ("x-coordinator-roles", "worker"))
    effects = []
    for task_id, caller in (("w-1", WORKER), ("w-2", other)):
        store.tasks.create(TaskSpec(task_id=task_id, input=b"x"), by="pm")
        claim = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=1, ttl_seconds=30)
        fence = worker.Claim(claim, metadata=caller).fence
        prepare = worker_pb2.PrepareEffectRequest(
            fence=fence, node_id="notify", effect_slot="email", payload_digest=digest_of(b"p")
        )
        prepared = worker.PrepareEffect(prepare, metadata=caller)
        effects.append((fence, prepared.effect_id, caller))
    ref = "https://mail.example/messages/" + "m" * 2000

    def record(n: int) -> worker_pb2.RecordEffectRequest:
        fence, effect_id, _ = effects[n]
        return worker_pb2.RecordEffectRequest(
            fence=fence, effect_id=effect_id, state=types_pb2.EFFECT_STATE_COMMITTED,
            external_ref=ref,
        )  # fmt: skip

    for n in range(3):  # worker-a's budget goes on slots it never records
        worker.PrepareEffect(
            worker_pb2.PrepareEffectRequest(
                fence=effects[0][0], node_id="notify", effect_slot=f"sms-{n}",
                payload_digest=digest_of(b"p"),
            ),
            metadata=WORKER,
        )  # fmt: skip
    refused(
        worker.RecordEffect, record(0), EXHAUSTED, "write budget of 'worker-a'", keyspace,
        metadata=WORKER,
    )  # fmt: skip
    assert store.effects.get(effects[0][1]).state.name == "PREPARED"
    recorded = worker.RecordEffect(record(1), metadata=other)
    assert (recorded.outcome, recorded.effect.external_ref) == (types_pb2.OUTCOME_OK, ref)
    registry: CollectorRegistry = store.ctx.metrics.registry
    assert (
        registry.get_sample_value("coordinator_write_budget_refusals_total", {"what": "effect"})
        == 1
    )


def test_a_worker_past_its_budget_commits_no_result_and_another_worker_commits_on(
    worker: worker_pb2_grpc.WorkerServiceStub, keyspace: Probe, store: Store
) -> None:
    """A commit's inline result is charged (one token committing 512 KiB results filled etcd to
    NOSPACE in seconds); refused typed, it writes nothing and the claim stays held, so the SDK
    retries it once the budget refilled. A commit with no result still lands: draining is
    free."""
    other = (("x-coordinator-principal", "worker-b"), ("x-coordinator-roles", "worker"))
    result = b"r" * 5_000  # stored base64: about 7.2 KB of a 10 KB budget
    fences = {}
    for task_id, caller in (("w-1", WORKER), ("w-2", WORKER), ("w-3", other), ("w-4", WORKER)):
        store.tasks.create(TaskSpec(task_id=task_id, input=b"x"), by="pm")
        claim = worker_pb2.ClaimRequest(task_id=task_id, scheduler_epoch=1, ttl_seconds=30)
        fences[task_id] = (worker.Claim(claim, metadata=caller).fence, caller)

    def commit(task_id: str, payload: bytes) -> worker_pb2.CommitRequest:
        return worker_pb2.CommitRequest(
            fence=fences[task_id][0], input_digest=digest_of(b"x"),
            result_digest=digest_of(payload), result=payload,
        )  # fmt: skip

    committed = types_pb2.OUTCOME_COMMITTED
    assert worker.Commit(commit("w-1", result), metadata=WORKER).outcome == committed
    refused(
        worker.Commit, commit("w-2", result), EXHAUSTED, "write budget of 'worker-a'", keyspace,
        metadata=WORKER,
    )  # fmt: skip
    assert store.tasks.get("w-2").state.name == "CLAIMED"
    assert worker.Commit(commit("w-3", result), metadata=other).outcome == committed
    assert worker.Commit(commit("w-4", b""), metadata=WORKER).outcome == committed
    registry: CollectorRegistry = store.ctx.metrics.registry
    assert (
        registry.get_sample_value("coordinator_write_budget_refusals_total", {"what": "result"})
        == 1
    )


def test_a_call_refused_for_its_input_is_given_its_charge_back(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe
) -> None:
    """Charged at the door, then refused INVALID_ARGUMENT, a call wrote nothing but its bytes
    stayed spent: eight creates with a 3 MB id used up a producer's budget, and its next, valid
    calls were told to retry later."""
    bad = tasks_pb2.CreateTaskRequest(task_id="a" * 300, input=b"x" * 1_000)
    for _ in range(5):  # each charged about 5 KB of the 10 KB budget, and given it back
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        refused(tasks.CreateTask, bad, invalid, "task_id must be", keyspace, metadata=PM_A)
    made = tasks.CreateTask(_create("a-1", 6000), metadata=PM_A)
    assert made.task.task_id == "a-1"
