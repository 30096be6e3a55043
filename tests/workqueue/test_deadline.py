"""schedule_to_close: past it the task is FAILED (TIMED_OUT) whatever runs, and the holder's
every acceptance point is refused FENCED with reason DEADLINE_EXCEEDED (never an outcome of its
own: Commit keeps claim.v1's four), writing nothing. Manual clock, real etcd."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from coordinator.clock import ManualClock
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.effects import EffectState
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import (
    AttemptEnd,
    DeadLetterReason,
    FenceReason,
    Op,
    Outcome,
    TaskState,
)
from coordinator.errors import FailedPrecondition
from coordinator.store import Store, TaskSpec
from coordinator.store.attempts.renew_plans import Renewal
from coordinator.store.effects.jobs import JobSpec
from coordinator.store.types import RenewResult
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, claim_result
from tests.workqueue.test_retry_policy import _events

DEADLINE_EXCEEDED = (Outcome.FENCED, FenceReason.DEADLINE_EXCEEDED)
POINTS = (
    "commit",
    "renew",
    "renew_many",
    "authorize_tool",
    "stage_result",
    "fail",
    "release",
    "prepare_effect",
    "record_effect",
    "start_job",
)


def _create(store: Store, task_id: str, **fields: Any) -> None:
    spec = TaskSpec(task_id=task_id, input=b"x", schedule_to_close=60.0, **fields)
    store.tasks.create(spec, by="pm")


def _prepared(store: Store, fence: Fence) -> str:
    """An effect the holder prepared before the deadline (so RecordEffect has one to record)."""
    prepared = store.effects.prepare(
        fence, principal="w1", node_id="n", effect_slot="s", payload_digest=digest_of(b"p")
    )
    assert prepared.effect is not None
    return prepared.effect.effect_id


def _every_acceptance_point(store: Store, fence: Fence, effect_id: str) -> dict[str, Any]:
    """The (outcome, reason) each acceptance point answers ``fence`` now."""
    digest = store.tasks.get(fence.task_id).input_digest
    renewed_many = store.renewals.renew_many([Renewal(fence, "p")], principal="w1")[0]
    assert isinstance(renewed_many, RenewResult)
    job = JobSpec(job_id="j", host="h", pid=1, start_ticks=1, argv=("x",), log_ref="l")
    verdicts = {
        "commit": store.acceptance.commit(
            fence,
            principal="w1",
            input_digest=digest,
            result_digest=digest_of(b"late"),
            result=b"late",
            result_ref="",
        ).verdict,
        "renew": store.renewals.renew(fence, principal="w1", progress="p").verdict,
        "renew_many": renewed_many.verdict,
        "authorize_tool": store.acceptance.authorize_tool(
            fence, principal="w1", tool="t", action="a"
        ),
        "stage_result": store.acceptance.stage_result(
            fence, principal="w1", result_digest=digest_of(b"s"), result=b"s", result_ref=""
        ).verdict,
        "fail": store.failures.fail(
            fence, principal="w1", report=FailureReport(retryable=True, code="E")
        ).verdict,
        "release": store.acceptance.release(fence, principal="w1", reason="late"),
        "prepare_effect": store.effects.prepare(
            fence, principal="w1", node_id="n", effect_slot="s2", payload_digest=digest_of(b"q")
        ).verdict,
        "record_effect": store.effects.record(
            fence,
            principal="w1",
            effect_id=effect_id,
            state=EffectState.COMMITTED,
            external_ref="r",
            etag="",
        ).verdict,
        "start_job": store.jobs.start(fence, principal="w1", spec=job).verdict,
    }
    assert tuple(verdicts) == POINTS
    return {point: (v.outcome, v.reason) for point, v in verdicts.items()}


def test_a_deadline_passing_while_held_fails_the_task_and_refuses_the_holder(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store()
    _create(store, "t")
    fence = claim(store, "t")
    effect_id = _prepared(store, fence)
    assert store.tasks.get("t").deadline == clock.now() + 60
    clock.advance(59.9)
    assert store.deadlines.time_out_due() == 0
    clock.advance(0.1)
    eventually(lambda: store.tasks.get("t").state is TaskState.FAILED)  # the loop's pass

    task = store.tasks.get("t")
    assert (task.dead_letter_reason, store.tasks.attempts("t")[0].end) == (
        DeadLetterReason.TIMED_OUT,
        AttemptEnd.TIMED_OUT,
    )
    assert etcd_client.get(store.ctx.keys.claim("t"))[0] is None  # the claim is over
    last = _events(store, etcd_client, "t")[-1]
    assert (last.op, last.from_state, last.by) == (
        Op.TIME_OUT,
        TaskState.CLAIMED,
        "coordinator:deadlines",
    )

    def probe() -> tuple[int, int]:
        metas = [meta for _, meta in etcd_client.get_prefix(store.ctx.keys.prefix + "/")]
        return len(metas), max(m.mod_revision for m in metas)

    before = probe()
    answers = _every_acceptance_point(store, fence, effect_id)
    assert answers == dict.fromkeys(POINTS, DEADLINE_EXCEEDED)
    assert probe() == before
    assert list(etcd_client.get_prefix(store.ctx.keys.deadlines_prefix)) == []


@pytest.mark.parametrize("waiting_in", [TaskState.READY, TaskState.DELAYED])
def test_a_waiting_task_times_out_too_and_is_no_longer_handed_out(
    make_store: StoreFactory, clock: ManualClock, waiting_in: TaskState
) -> None:
    store = make_store(reclaim=False)  # passes by hand
    not_before = clock.now() + 3600 if waiting_in is TaskState.DELAYED else 0.0
    _create(store, "t", not_before=not_before)
    assert store.tasks.get("t").state is waiting_in
    clock.advance(60)
    assert claim_result(store, "t").verdict.outcome is Outcome.NOT_CLAIMABLE  # before the pass
    assert store.deadlines.time_out_due() == 1
    assert store.deadlines.time_out_due() == 0  # once
    assert store.tasks.get("t").state is TaskState.FAILED


def test_a_committed_task_leaves_the_deadline_index(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)
    _create(store, "t")
    fence = claim(store, "t")
    task = store.tasks.get("t")
    store.acceptance.commit(
        fence,
        principal="w1",
        input_digest=task.input_digest,
        result_digest=digest_of(b"r"),
        result=b"r",
        result_ref="",
    )
    assert list(etcd_client.get_prefix(store.ctx.keys.deadlines_prefix)) == []
    clock.advance(120)
    assert store.deadlines.time_out_due() == 0
    assert store.tasks.get("t").state is TaskState.DONE


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (Duration(seconds=0), "schedule_to_close must be 1 s to 31536000 s (365 days), got 0 s"),
        (Duration(seconds=-5), "got -5 s"),
        (Duration(seconds=366 * 86400), "got 3.16224e+07 s"),
    ],
)
def test_a_bad_schedule_to_close_is_refused(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Any, value: Duration, message: str
) -> None:
    before = keyspace()
    with pytest.raises(grpc.RpcError) as refused:
        tasks.CreateTask(tasks_pb2.CreateTaskRequest(task_id="t", schedule_to_close=value))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    assert keyspace() == before
    created = tasks.CreateTask(
        tasks_pb2.CreateTaskRequest(task_id="ok", schedule_to_close=Duration(seconds=90))
    ).task
    assert created.deadline.seconds - created.created_at.seconds in (89, 90, 91)


def test_every_acceptance_point_refuses_from_the_deadline_on_before_any_pass_ran(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    """Between the deadline and the pass that fails the task, the holder is refused FENCED
    (DEADLINE_EXCEEDED) at every acceptance point, writing nothing: no result, stage, effect
    or job lands after schedule_to_close."""
    store = make_store(reclaim=False)  # no deadline pass runs unless called
    _create(store, "t")
    fence = claim(store, "t")
    effect_id = _prepared(store, fence)
    clock.advance(60)
    assert store.tasks.get("t").state is TaskState.CLAIMED  # nothing moved it yet

    def probe() -> tuple[int, int]:
        metas = [meta for _, meta in etcd_client.get_prefix(store.ctx.keys.prefix + "/")]
        return len(metas), max(m.mod_revision for m in metas)

    before = probe()
    answers = _every_acceptance_point(store, fence, effect_id)
    assert answers == dict.fromkeys(POINTS, DEADLINE_EXCEEDED)
    assert probe() == before
    assert store.deadlines.time_out_due() == 1  # the pass still moves it, once
    assert store.tasks.get("t").state is TaskState.FAILED


def test_a_timed_out_task_is_retried_only_with_a_new_deadline(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store(reclaim=False)  # passes by hand
    _create(store, "t")
    clock.advance(60)
    assert store.deadlines.time_out_due() == 1
    keys = store.ctx.keys

    def probe() -> tuple[int, int]:
        metas = [meta for _, meta in etcd_client.get_prefix(keys.prefix + "/")]
        return len(metas), max(m.mod_revision for m in metas)

    before = probe()
    with pytest.raises(FailedPrecondition, match="retry it with a new schedule_to_close"):
        store.dead_letters.retry("t", by="pm", reason="again")
    assert probe() == before  # refused: nothing written

    retried = store.dead_letters.retry("t", by="pm", reason="again", schedule_to_close=120.0)
    assert (retried.state, retried.deadline) == (TaskState.READY, clock.now() + 120)
    deadline_keys = [m.key.decode() for _, m in etcd_client.get_prefix(keys.deadlines_prefix)]
    assert deadline_keys == [keys.deadline(clock.now() + 120, "t")]  # the old one is gone
    clock.advance(119)
    assert store.deadlines.time_out_due() == 0  # the next pass leaves it alone
    claim(store, "t")
    clock.advance(1)
    assert store.deadlines.time_out_due() == 1  # the new deadline is the one enforced
    assert store.tasks.get("t").dead_letter_reason is DeadLetterReason.TIMED_OUT


def test_a_failed_task_keeps_its_deadline_when_retried_before_it(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store(reclaim=False)
    _create(store, "t")
    fence = claim(store, "t")
    report = FailureReport(retryable=False, code="BadInput")
    failed = store.failures.fail(fence, principal="w1", report=report)
    assert failed.verdict.outcome is Outcome.OK
    deadline = store.tasks.get("t").deadline
    retried = store.dead_letters.retry("t", by="pm", reason="fixed")
    assert (retried.state, retried.deadline) == (TaskState.READY, deadline)
