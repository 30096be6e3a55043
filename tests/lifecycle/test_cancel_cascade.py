"""An upstream that ends CANCELLED (or FAILED) blocks its WAITING dependents, visibly, and never
cancels them; cancelling the graph below a task is CancelTask with cascade, bounded."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.domain.failures import FailureReport
from coordinator.domain.states import Op, TaskState, WaitingReason
from coordinator.domain.waiting import waiting_reason
from coordinator.errors import FailedPrecondition
from coordinator.store import Store
from coordinator.store.lifecycle import cascade
from coordinator.store.lifecycle.releaser import RELEASER
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2
from tests.helpers import eventually
from tests.lifecycle.support import claim, create, events, finish, who


def _state(store: Store, task_id: str) -> TaskState:
    return store.tasks.get(task_id).state


def test_cancelling_an_upstream_blocks_its_dependents_and_cancels_none(
    store: Store, etcd_client: Any
) -> None:
    create(store, "build")
    create(store, "other")
    create(store, "test", depends_on=("build",))
    create(store, "deploy", depends_on=("test", "other"))
    store.tasks.cancel("build", by="pm", reason="dropped")
    eventually(lambda: store.tasks.get("test").blocked_by == ("build",), timeout=5)
    test, deploy = store.tasks.get("test"), store.tasks.get("deploy")
    assert (test.state, waiting_reason(test)) == (TaskState.WAITING, WaitingReason.UPSTREAM_FAILED)
    # Further down nothing is blocked by a FAILED or CANCELLED task: it waits for "test".
    assert (deploy.state, waiting_reason(deploy)) == (
        TaskState.WAITING,
        WaitingReason.UPSTREAMS_PENDING,
    )
    assert _state(store, "other") is TaskState.READY  # an upstream is never touched
    last = events(store, etcd_client, "test")[-1]
    assert (last.op, last.by, last.from_state, last.to_state, last.detail) == (
        Op.MARK_BLOCKED,
        RELEASER,
        TaskState.WAITING,
        TaskState.WAITING,
        "blocked by build (CANCELLED): test stays WAITING until each is DONE; a CANCELLED one "
        "never runs again: change test's upstreams (`tasks deps test --set`/`--clear`) or "
        "cancel test",
    )
    assert test.cancel_generation == 0
    keys = store.ctx.keys
    assert etcd_client.get(keys.waiting("test"))[0] is not None
    assert etcd_client.get(keys.blocked("test"))[0] == b"default"  # the queue, for the counts
    assert etcd_client.get(keys.blocked("deploy"))[0] is None


def test_a_dependent_with_a_done_and_a_cancelled_upstream_is_blocked_not_released(
    store: Store, etcd_client: Any
) -> None:
    create(store, "a")
    create(store, "b")
    create(store, "c", depends_on=("a", "b"))
    finish(store, "a")
    store.tasks.cancel("b", by="pm", reason="dropped")
    eventually(lambda: store.tasks.get("c").blocked_by == ("b",), timeout=5)
    assert [e.op for e in events(store, etcd_client, "c")] == [Op.CREATE_WAITING, Op.MARK_BLOCKED]
    assert store.releaser.scan() == 0  # a scan releases nothing and writes no second mark
    assert len(events(store, etcd_client, "c")) == 2


def test_the_periodic_scan_marks_what_no_watch_saw(store: Store, etcd_client: Any) -> None:
    store.releaser.close()  # no watch: as if every replica was down when "up" was cancelled
    create(store, "up")
    create(store, "down", depends_on=("up",))
    store.tasks.cancel("up", by="pm", reason="dropped")
    assert store.tasks.get("down").blocked_by == ()
    assert store.releaser.scan() == 0  # a mark is not a release
    down = store.tasks.get("down")
    assert (down.state, down.blocked_by) == (TaskState.WAITING, ("up",))
    assert [e.op for e in events(store, etcd_client, "down")] == [
        Op.CREATE_WAITING,
        Op.MARK_BLOCKED,
    ]


def test_cancel_with_cascade_cancels_the_waiting_graph_below_and_only_it(
    tasks: tasks_pb2_grpc.TaskServiceStub, store: Store, etcd_client: Any
) -> None:
    create(store, "build")
    create(store, "other")
    create(store, "done")
    finish(store, "done")
    create(store, "test", depends_on=("build",))
    create(store, "deploy", depends_on=("test", "other"))
    create(store, "notify", depends_on=("deploy", "done"))
    reply = tasks.CancelTask(
        tasks_pb2.CancelTaskRequest(task_id="build", reason="dropped", cascade=True),
        metadata=who("ops", "admin"),
    )
    assert reply.task.state == types_pb2.TASK_STATE_CANCELLED
    assert list(reply.cascaded) == ["test", "deploy", "notify"]
    for task_id in ("test", "deploy", "notify"):
        assert _state(store, task_id) is TaskState.CANCELLED
        last = events(store, etcd_client, task_id)[-1]
        assert (last.op, last.by, last.detail) == (
            Op.CANCEL,
            "ops",
            "cancelled with its upstream build: dropped",
        )
    assert (_state(store, "other"), _state(store, "done")) == (TaskState.READY, TaskState.DONE)
    # Repeating it is harmless: nothing is left to cancel.
    again = tasks.CancelTask(
        tasks_pb2.CancelTaskRequest(task_id="build", cascade=True), metadata=who("ops", "admin")
    )
    assert (again.task.state, list(again.cascaded)) == (types_pb2.TASK_STATE_CANCELLED, [])


def test_cancel_with_cascade_below_a_dead_letter_leaves_it_failed(store: Store) -> None:
    create(store, "up")
    create(store, "down", depends_on=("up",))
    report = FailureReport(retryable=False, code="BadInput")
    store.failures.fail(claim(store, "up"), principal="w1", report=report)
    eventually(lambda: store.tasks.get("down").blocked_by == ("up",), timeout=5)
    task, cancelled = store.cascade.cancel("up", by="pm", reason="")
    assert (task.state, cancelled, _state(store, "down")) == (
        TaskState.FAILED,
        ["down"],
        TaskState.CANCELLED,
    )
    # Without cascade a dead letter is refused as before: FAILED is left only by RetryTask.
    with pytest.raises(FailedPrecondition, match="FAILED; it cannot be cancelled"):
        store.tasks.cancel("up", by="pm", reason="")


def test_a_cascade_past_its_bound_is_refused_and_writes_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch, tasks: tasks_pb2_grpc.TaskServiceStub
) -> None:
    monkeypatch.setattr(cascade, "MAX_CASCADE", 2)
    create(store, "up")
    for n in range(3):
        create(store, f"down{n}", depends_on=("up",))
    with pytest.raises(FailedPrecondition, match="more than 2 tasks"):
        store.cascade.cancel("up", by="pm", reason="")
    with pytest.raises(grpc.RpcError) as refused:
        tasks.CancelTask(
            tasks_pb2.CancelTaskRequest(task_id="up", cascade=True), metadata=who("ops", "admin")
        )
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert [_state(store, t) for t in ("up", "down0", "down1", "down2")] == [
        TaskState.READY,
        TaskState.WAITING,
        TaskState.WAITING,
        TaskState.WAITING,
    ]


def test_a_cascade_pages_through_dependents_that_are_not_waiting(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cascade, "_BATCH", 2)  # the first page holds only ended dependents
    create(store, "up")
    for n in range(4):
        create(store, f"down{n}", depends_on=("up",))
    for ended in ("down0", "down1"):
        store.tasks.cancel(ended, by="pm", reason="")
    assert store.cascade.cancel("up", by="pm", reason="")[1] == ["down2", "down3"]
