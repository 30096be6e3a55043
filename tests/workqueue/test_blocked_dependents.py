"""Dependencies keep their meaning (issue 24, item 3): a dependent of a dead letter stays
visibly blocked (listed, counted, never claimable) and waits again by itself when the upstream
is retried and commits; a WAITING task past its schedule_to_close is overdue, not FAILED, and
still runs when its upstreams are DONE. Real etcd and server, a manual clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from coordinator.cli.task_views import task_fields, task_row
from coordinator.clock import ManualClock
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import DeadLetterReason, Op, Outcome, TaskState
from coordinator.metrics import Metrics
from coordinator.sdk.tasks import TaskInfo
from coordinator.store import Store, TaskSpec
from coordinator.v1 import admin_pb2, admin_pb2_grpc, tasks_pb2, tasks_pb2_grpc, types_pb2
from tests.helpers import eventually
from tests.lifecycle.support import who
from tests.store.support import StoreFactory, claim, claim_result, commit, events

PM = who("pm", "pm")


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """The served store on the manual clock, its loops on (the releaser's watch included)."""
    return make_store()


def _create(store: Store, task_id: str, *depends_on: str, schedule_to_close: float = 0) -> None:
    spec = TaskSpec(
        task_id=task_id,
        input=task_id.encode(),
        depends_on=depends_on,
        schedule_to_close=schedule_to_close,
    )
    store.tasks.create(spec, by="pm")


def _dead_letter(store: Store, task_id: str) -> None:
    report = FailureReport(retryable=False, code="BadInput")
    assert store.failures.fail(claim(store, task_id), principal="w1", report=report).state is (
        TaskState.FAILED
    )


def _get(tasks: tasks_pb2_grpc.TaskServiceStub, task_id: str) -> types_pb2.Task:
    return tasks.GetTask(tasks_pb2.GetTaskRequest(task_id=task_id), metadata=PM).task


def _listed(tasks: tasks_pb2_grpc.TaskServiceStub, **filters: Any) -> list[str]:
    reply = tasks.ListTasks(tasks_pb2.ListTasksRequest(**filters), metadata=PM)
    return [t.task_id for t in reply.tasks]


def _queue(admin: admin_pb2_grpc.AdminServiceStub) -> tuple[int, int, int]:
    """(ready, blocked, overdue) of the default queue in GetStats."""
    stats = admin.GetStats(admin_pb2.GetStatsRequest(), metadata=PM).queues
    q = next((s for s in stats if s.queue == "default"), admin_pb2.QueueStats())
    return q.ready_tasks, q.blocked_tasks, q.overdue_tasks


def test_dependents_of_a_dead_letter_stay_blocked_and_run_after_retry_and_commit(
    store: Store,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    etcd_client: Any,
) -> None:
    _create(store, "up")
    _create(store, "down", "up")
    _create(store, "last", "down")
    _dead_letter(store, "up")

    eventually(lambda: _get(tasks, "down").blocked_by, timeout=5)
    down = _get(tasks, "down")
    assert (down.state, list(down.blocked_by), down.waiting_reason) == (
        types_pb2.TASK_STATE_WAITING,
        ["up"],
        types_pb2.WAITING_REASON_UPSTREAM_FAILED,
    )
    # Further down it waits for "down", which has not failed.
    last = _get(tasks, "last")
    assert (last.state, last.waiting_reason) == (
        types_pb2.TASK_STATE_WAITING,
        types_pb2.WAITING_REASON_UPSTREAMS_PENDING,
    )
    assert _listed(tasks, blocked=True) == ["down"]
    assert eventually(lambda: _queue(admin) == (0, 1, 0) or None, timeout=5)
    # Never claimable.
    assert claim_result(store, "down").verdict.outcome is Outcome.NOT_CLAIMABLE
    nothing = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert nothing.verdict.outcome is Outcome.NO_READY_TASK

    tasks.RetryTask(tasks_pb2.RetryTaskRequest(task_id="up", reason="fixed"), metadata=PM)
    eventually(lambda: not _get(tasks, "down").blocked_by, timeout=5)
    assert _get(tasks, "down").waiting_reason == types_pb2.WAITING_REASON_UPSTREAMS_PENDING
    assert _listed(tasks, blocked=True) == []
    assert commit(store, claim(store, "up")).verdict.outcome is Outcome.COMMITTED
    # No other call: the releaser's watch releases it.
    eventually(lambda: store.tasks.get("down").state is TaskState.READY, timeout=5)
    assert [e.op for e in events(store, etcd_client, "down")] == [
        Op.CREATE_WAITING,
        Op.MARK_BLOCKED,
        Op.MARK_BLOCKED,
        Op.UNBLOCK,
    ]
    assert commit(store, claim(store, "down")).verdict.outcome is Outcome.COMMITTED
    eventually(lambda: store.tasks.get("last").state is TaskState.READY, timeout=5)
    assert store.tasks.get("down").cancel_generation == 0  # never cancelled on the way
    eventually(lambda: _queue(admin) == (1, 0, 0) or None, timeout=5)


def test_a_waiting_task_past_its_deadline_is_overdue_not_failed_and_still_runs(
    store: Store,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    admin: admin_pb2_grpc.AdminServiceStub,
    clock: ManualClock,
    metrics: Metrics,
    etcd_client: Any,
) -> None:
    _create(store, "up")
    _create(store, "down", "up", schedule_to_close=60)
    deadline = store.tasks.get("down").deadline
    clock.advance(61)
    eventually(lambda: store.tasks.get("down").overdue_at, timeout=5)  # the loop's pass

    down = _get(tasks, "down")
    assert (down.state, down.dead_letter_reason, down.overdue_at.ToNanoseconds()) == (
        types_pb2.TASK_STATE_WAITING,
        types_pb2.DEAD_LETTER_REASON_UNSPECIFIED,
        round(clock.now() * 1e9),
    )
    last = events(store, etcd_client, "down")[-1]
    assert (last.op, last.from_state, last.to_state, last.by) == (
        Op.MARK_OVERDUE,
        TaskState.WAITING,
        TaskState.WAITING,
        "coordinator:deadlines",
    )
    overdue = metrics.registry.get_sample_value(
        "coordinator_tasks_overdue_total", {"queue": "default"}
    )
    assert overdue == 1
    assert store.deadlines.time_out_due() == 0  # marked once, out of the deadline index
    assert list(etcd_client.get_prefix(store.ctx.keys.deadlines_prefix)) == []
    assert _listed(tasks, overdue=True) == ["down"]
    assert _listed(tasks, overdue=True, state=types_pb2.TASK_STATE_READY) == []
    assert eventually(lambda: _queue(admin) == (1, 0, 1) or None, timeout=5)

    assert commit(store, claim(store, "up")).verdict.outcome is Outcome.COMMITTED
    eventually(lambda: store.tasks.get("down").state is TaskState.READY, timeout=5)
    released = store.tasks.get("down")
    # The deadline spent waiting is waived; overdue_at says why it runs without one.
    assert (released.deadline, released.overdue_at, deadline) == (0.0, clock.now(), clock.now() - 1)
    clock.advance(3600)
    assert store.deadlines.time_out_due() == 0
    assert commit(store, claim(store, "down")).verdict.outcome is Outcome.COMMITTED
    assert store.tasks.get("down").dead_letter_reason is DeadLetterReason.NONE
    assert _listed(tasks, overdue=True) == ["down"]  # the mark stays on the record


def test_a_task_released_before_its_deadline_keeps_it_and_times_out_as_before(
    store: Store, clock: ManualClock
) -> None:
    _create(store, "up")
    _create(store, "down", "up", schedule_to_close=60)
    assert commit(store, claim(store, "up")).verdict.outcome is Outcome.COMMITTED
    eventually(lambda: store.tasks.get("down").state is TaskState.READY, timeout=5)
    clock.advance(61)
    eventually(lambda: store.tasks.get("down").state is TaskState.FAILED, timeout=5)
    down = store.tasks.get("down")
    assert (down.dead_letter_reason, down.overdue_at) == (DeadLetterReason.TIMED_OUT, 0.0)


def test_the_sdk_shows_the_blocked_and_overdue_marks() -> None:
    wire = types_pb2.Task(task_id="t", state=types_pb2.TASK_STATE_WAITING, blocked_by=["a", "b"])
    wire.overdue_at.FromSeconds(1_700_000_000)
    info = TaskInfo.from_proto(wire)
    assert (info.blocked_by, info.overdue_at) == (
        ("a", "b"),
        datetime.fromtimestamp(1_700_000_000, tz=UTC),
    )
    wire.ClearField("overdue_at")
    assert TaskInfo.from_proto(wire).overdue_at is None


def test_the_cli_shows_the_blocked_and_overdue_marks() -> None:
    """`tasks get` had no overdue line (only `--json` said it), and `tasks list` showed a
    blocked or overdue task as plain WAITING."""
    wire = types_pb2.Task(task_id="t", state=types_pb2.TASK_STATE_WAITING, blocked_by=["a"])
    wire.overdue_at.FromSeconds(1_700_000_000)
    info = TaskInfo.from_proto(wire)
    fields = dict(task_fields(info))
    assert (fields["blocked_by"], fields["overdue"]) == (
        "a",
        "2023-11-14T22:13:20+00:00 (deadline waived)",
    )
    assert task_row(info)[2] == "WAITING(blocked,overdue)"
    wire.ClearField("overdue_at")
    assert task_row(TaskInfo.from_proto(wire))[2] == "WAITING(blocked)"
    assert dict(task_fields(TaskInfo.from_proto(wire)))["overdue"] == "-"
