"""An upstream that can never be DONE (CANCELLED or FAILED) cancels its WAITING dependents,
down the whole graph, each with an event naming the upstream: no dependent waits forever."""

from __future__ import annotations

from typing import Any

from coordinator.domain.states import Op, TaskState
from coordinator.store import Store
from coordinator.store.releaser import RELEASER
from tests.helpers import eventually
from tests.lifecycle.support import create, events, finish


def _state(store: Store, task_id: str) -> TaskState:
    return store.tasks.get(task_id).state


def test_cancelling_an_upstream_cancels_its_dependents_down_the_graph(
    store: Store, etcd_client: Any
) -> None:
    create(store, "build")
    create(store, "other")
    create(store, "test", depends_on=("build",))
    create(store, "deploy", depends_on=("test", "other"))
    store.tasks.cancel("build", by="pm", reason="dropped")
    eventually(lambda: _state(store, "deploy") is TaskState.CANCELLED, timeout=5)
    assert _state(store, "test") is TaskState.CANCELLED
    assert _state(store, "other") is TaskState.READY  # an upstream is never touched
    last = events(store, etcd_client, "test")[-1]
    assert (last.op, last.by, last.detail) == (
        Op.CANCEL,
        RELEASER,
        "upstream will never be DONE: build (CANCELLED)",
    )
    assert events(store, etcd_client, "deploy")[-1].detail == (
        "upstream will never be DONE: test (CANCELLED)"
    )
    assert store.tasks.get("test").cancel_generation == 1
    assert etcd_client.get(store.ctx.keys.waiting("deploy"))[0] is None


def test_a_dependent_with_a_done_and_a_cancelled_upstream_is_cancelled_not_released(
    store: Store, etcd_client: Any
) -> None:
    create(store, "a")
    create(store, "b")
    create(store, "c", depends_on=("a", "b"))
    finish(store, "a")
    store.tasks.cancel("b", by="pm", reason="dropped")
    eventually(lambda: _state(store, "c") is TaskState.CANCELLED, timeout=5)
    assert [e.op for e in events(store, etcd_client, "c")] == [Op.CREATE_WAITING, Op.CANCEL]


def test_the_periodic_scan_cancels_what_no_watch_saw(store: Store, etcd_client: Any) -> None:
    store.releaser.close()  # no watch: as if every replica was down when "up" was cancelled
    create(store, "up")
    create(store, "down", depends_on=("up",))
    store.tasks.cancel("up", by="pm", reason="dropped")
    assert _state(store, "down") is TaskState.WAITING
    assert store.releaser.scan() == 0  # a cancel is not a release
    assert _state(store, "down") is TaskState.CANCELLED
    assert [e.op for e in events(store, etcd_client, "down")] == [Op.CREATE_WAITING, Op.CANCEL]
