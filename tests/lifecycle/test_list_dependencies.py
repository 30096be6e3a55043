"""ListDependencies over real gRPC: a task's upstreams in depends_on order and its dependents
a page at a time, each with its state; an unknown task is NOT_FOUND and bad input is refused
with the field named, writing nothing."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2
from tests import helpers
from tests.helpers import Probe
from tests.lifecycle.support import who

PM = who("pm-1")


def _create(tasks: tasks_pb2_grpc.TaskServiceStub, task_id: str, *depends_on: str) -> None:
    request = tasks_pb2.CreateTaskRequest(task_id=task_id, input=b"i", depends_on=depends_on)
    tasks.CreateTask(request, metadata=PM)


def _nodes(nodes: Any) -> list[tuple[str, str]]:
    return [
        (n.task_id, types_pb2.TaskState.Name(n.state).removeprefix("TASK_STATE_")) for n in nodes
    ]


def test_upstreams_and_dependents_come_with_their_states(
    tasks: tasks_pb2_grpc.TaskServiceStub,
) -> None:
    _create(tasks, "fetch")
    _create(tasks, "merge", "fetch")
    _create(tasks, "report", "merge")
    _create(tasks, "chart", "merge")
    _create(tasks, "alert", "merge", "fetch")

    merge = tasks.ListDependencies(tasks_pb2.ListDependenciesRequest(task_id="merge"))
    assert _nodes(merge.upstreams) == [("fetch", "READY")]
    assert _nodes(merge.dependents) == [
        ("alert", "WAITING"),
        ("chart", "WAITING"),
        ("report", "WAITING"),
    ]
    assert merge.next_page_token == ""
    alert = tasks.ListDependencies(tasks_pb2.ListDependenciesRequest(task_id="alert"))
    assert _nodes(alert.upstreams) == [("merge", "WAITING"), ("fetch", "READY")]  # as given
    assert list(alert.dependents) == []
    assert not any(n.pruned for n in alert.upstreams)

    first = tasks.ListDependencies(tasks_pb2.ListDependenciesRequest(task_id="merge", page_size=2))
    assert (_nodes(first.dependents), helpers.resumes_at(first.next_page_token)) == (
        [("alert", "WAITING"), ("chart", "WAITING")],
        "chart",
    )
    rest = tasks.ListDependencies(
        tasks_pb2.ListDependenciesRequest(
            task_id="merge", page_size=2, page_token=first.next_page_token
        )
    )
    assert (_nodes(rest.dependents), rest.next_page_token) == ([("report", "WAITING")], "")
    assert _nodes(rest.upstreams) == [("fetch", "READY")]  # on every page


def test_an_unknown_task_is_not_found(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe
) -> None:
    helpers.refused(
        tasks.ListDependencies,
        tasks_pb2.ListDependenciesRequest(task_id="nobody"),
        grpc.StatusCode.NOT_FOUND,
        "'nobody' does not exist",
        keyspace,
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"task_id": ""}, "task_id"),
        ({"task_id": "no spaces"}, "task_id"),
        ({"task_id": "fetch", "page_size": 1001}, "page_size"),
        ({"task_id": "fetch", "page_token": "no spaces"}, "page_token"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_writes_nothing(
    tasks: tasks_pb2_grpc.TaskServiceStub, keyspace: Probe, fields: dict[str, Any], named: str
) -> None:
    _create(tasks, "fetch")
    helpers.refused(
        tasks.ListDependencies,
        tasks_pb2.ListDependenciesRequest(**fields),
        grpc.StatusCode.INVALID_ARGUMENT,
        named,
        keyspace,
    )
