"""Bad input to the lifecycle RPCs, through a real gRPC channel: a clear status naming the field
or the conflict, and nothing written. Also: role, scope and current revision are re-checked
before acting, and the executor cannot change the graph."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from coordinator.store import Store
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2
from tests.lifecycle.support import claim, create, finish, snapshot, who

PM = who("pm-1")
C = tasks_pb2.CreateTaskRequest
S = tasks_pb2.SetDependenciesRequest
A = tasks_pb2.AcceptRequest
R = tasks_pb2.RejectRequest
L = tasks_pb2.ListTasksRequest
W = tasks_pb2.WatchEventsRequest
INVALID = grpc.StatusCode.INVALID_ARGUMENT
MANY = [f"u{n}" for n in range(51)]

CASES: list[tuple[str, Any, grpc.StatusCode, str]] = [
    # CreateTask: dependencies and lineage
    ("CreateTask", C(task_id="n", depends_on=[""]), INVALID, "depends_on[0] is required"),
    ("CreateTask", C(task_id="n", depends_on=["a", "bad id"]), INVALID, "depends_on[1] must be"),
    ("CreateTask", C(task_id="n", depends_on=["a", "a"]), INVALID, "depends_on lists 'a' twice"),
    ("CreateTask", C(task_id="n", depends_on=["n"]), INVALID, "names the task itself (n -> n)"),
    ("CreateTask", C(task_id="n", depends_on=MANY), INVALID, "lists 51 tasks, the limit is 50"),
    (
        "CreateTask",
        C(task_id="n", depends_on=["a", "ghost"]),
        grpc.StatusCode.NOT_FOUND,
        "depends_on names tasks that do not exist: ghost",
    ),
    ("CreateTask", C(task_id="n", thread_key="#2"), INVALID, "thread_key '#2' has nothing left"),
    ("CreateTask", C(task_id="n", thread_key="a b"), INVALID, "thread_key must normalize"),
    ("CreateTask", C(task_id="n", root_task_id="a"), INVALID, "parent_task_id is missing"),
    ("CreateTask", C(task_id="n", root_task_id="a b"), INVALID, "root_task_id must be"),
    (
        "CreateTask",
        C(task_id="n", root_task_id="ghost", parent_task_id="a"),
        grpc.StatusCode.NOT_FOUND,
        "root_task_id 'ghost' does not exist",
    ),
    # SetDependencies
    ("SetDependencies", S(task_id="", depends_on=["a"]), INVALID, "task_id is required"),
    ("SetDependencies", S(task_id="a", depends_on=["a"]), INVALID, "names the task itself"),
    ("SetDependencies", S(task_id="a", depends_on=[""]), INVALID, "depends_on[0] is required"),
    ("SetDependencies", S(task_id="a", depends_on=MANY), INVALID, "the limit is 50"),
    (
        "SetDependencies",
        S(task_id="a", depends_on=["b"]),
        grpc.StatusCode.FAILED_PRECONDITION,
        "dependency cycle refused: a -> b -> a",
    ),
    (
        "SetDependencies",
        S(task_id="ghost", depends_on=["a"]),
        grpc.StatusCode.NOT_FOUND,
        "task 'ghost' does not exist",
    ),
    (
        "SetDependencies",
        S(task_id="a", depends_on=["ghost"]),
        grpc.StatusCode.NOT_FOUND,
        "do not exist: ghost",
    ),
    (
        "SetDependencies",
        S(task_id="a", depends_on=[], expected_state_version=-1),
        INVALID,
        "expected_state_version must be >= 0",
    ),
    (
        "SetDependencies",
        S(task_id="a", depends_on=[], expected_state_version=1),
        grpc.StatusCode.FAILED_PRECONDITION,
        "expected 1",
    ),
    (
        "SetDependencies",
        S(task_id="r", depends_on=["a"]),
        grpc.StatusCode.FAILED_PRECONDITION,
        "task 'r' is REVIEW; its dependencies can change only while it is READY or WAITING",
    ),
    # Accept / Reject
    ("Accept", A(task_id="", revision=1), INVALID, "task_id is required"),
    ("Accept", A(task_id="r"), INVALID, "revision is required"),
    ("Accept", A(task_id="r", revision=-2), INVALID, "revision must be > 0"),
    ("Accept", A(task_id="ghost", revision=1), grpc.StatusCode.NOT_FOUND, "'ghost' does not"),
    (
        "Accept",
        A(task_id="r", revision=2),
        grpc.StatusCode.FAILED_PRECONDITION,
        "cannot accept revision 2 of task 'r': the task is at revision 1",
    ),
    (
        "Accept",
        A(task_id="a", revision=1),
        grpc.StatusCode.FAILED_PRECONDITION,
        "was not created with requires_review",
    ),
    ("Reject", R(task_id="r", revision=1), INVALID, "reason is required"),
    ("Reject", R(task_id="r", revision=1, reason="x" * 1025), INVALID, "reason is 1025 characters"),
    (
        "Reject",
        R(task_id="r", revision=3, reason="late"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "a review of revision 3 does not apply to revision 1",
    ),
    # ListTasks and WatchEvents filters
    ("ListTasks", L(root_task_id="a b"), INVALID, "root_task_id must be"),
    ("ListTasks", L(parent_task_id="a/b"), INVALID, "parent_task_id must be"),
    ("ListTasks", L(thread_key="/retry-2"), INVALID, "thread_key '/retry-2' has nothing left"),
    ("WatchEvents", W(ops=["claim", "steal"]), INVALID, "ops[1] 'steal' is not an operation"),
    ("WatchEvents", W(from_revision=-1), INVALID, "from_revision must be >= 0"),
    ("WatchEvents", W(task_id="a b"), INVALID, "task_id must be"),
    ("WatchEvents", W(queue="no queue"), INVALID, "queue must be"),
]


@pytest.fixture
def seeded(store: Store) -> Store:
    """a: READY; b: WAITING on a; r: REVIEW at revision 1, committed by w1."""
    create(store, "a")
    create(store, "b", depends_on=("a",))
    create(store, "r", review=True)
    finish(store, "r", "w1")
    return store


@pytest.mark.parametrize(("rpc", "request_", "code", "message"), CASES, ids=lambda v: str(v)[:40])
def test_bad_lifecycle_input_is_refused_naming_the_field_and_writes_nothing(
    rpc: str,
    request_: Any,
    code: grpc.StatusCode,
    message: str,
    seeded: Store,
    tasks: tasks_pb2_grpc.TaskServiceStub,
    etcd_client: Any,
) -> None:
    before = snapshot(seeded, etcd_client)
    with pytest.raises(grpc.RpcError) as refused:
        answer = getattr(tasks, rpc)(request_, metadata=PM)
        if rpc == "WatchEvents":
            list(answer)
    assert refused.value.code() == code, refused.value.details()
    assert message in (refused.value.details() or "")
    assert snapshot(seeded, etcd_client) == before


def test_role_scope_and_current_revision_are_rechecked_before_acting(
    seeded: Store, tasks: tasks_pb2_grpc.TaskServiceStub, etcd_client: Any
) -> None:
    before = snapshot(seeded, etcd_client)
    refusals = []
    # Role: a worker is not a reviewer (the auth interceptor's role table).
    for metadata, request in [
        (who("w2", roles="worker"), A(task_id="r", revision=1)),
        # Business rule: the reviewer is not the executor, whatever its roles.
        (who("w1", roles="pm"), A(task_id="r", revision=1)),
        # Current revision: the review names the revision it looked at.
        (who("pm-1", roles="pm"), A(task_id="r", revision=2)),
        # Scope: a child must belong to its parent's root.
        (
            who("pm-1", roles="pm"),
            C(task_id="c", root_task_id="b", parent_task_id="a"),
        ),
    ]:
        with pytest.raises(grpc.RpcError) as refused:
            if isinstance(request, A):
                tasks.Accept(request, metadata=metadata)
            elif isinstance(request, C):
                tasks.CreateTask(request, metadata=metadata)
        refusals.append(refused.value.code())
    assert refusals == [
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.FAILED_PRECONDITION,
    ]
    assert snapshot(seeded, etcd_client) == before
    accepted = tasks.Accept(A(task_id="r", revision=1), metadata=who("pm-1", roles="pm"))
    assert accepted.task.state == types_pb2.TASK_STATE_DONE


def test_executor_cannot_change_the_graph_through_the_api(
    seeded: Store, tasks: tasks_pb2_grpc.TaskServiceStub, etcd_client: Any
) -> None:
    claim(seeded, "a", "w1")
    before = snapshot(seeded, etcd_client)
    with pytest.raises(grpc.RpcError) as by_role:  # workers never shape the graph
        tasks.SetDependencies(S(task_id="b", depends_on=[]), metadata=who("w1", roles="worker"))
    assert by_role.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as in_flight:  # nor does anyone while a task runs
        tasks.SetDependencies(S(task_id="a", depends_on=["r"]), metadata=who("pm-1", roles="pm"))
    assert in_flight.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert snapshot(seeded, etcd_client) == before
