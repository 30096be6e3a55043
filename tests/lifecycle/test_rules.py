"""The pure lifecycle rules (no etcd): cycle detection, edge lists, review checks, idempotency
decisions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.graph import check_dependencies, find_cycle, format_cycle
from coordinator.domain.idempotency import IdemAction, IdemRecord, IdemState, decide
from coordinator.domain.records import ResultRecord, TaskRecord
from coordinator.domain.review import ReviewAction, ReviewDecision, check_review
from coordinator.domain.states import TaskState
from coordinator.errors import FailedPrecondition, InvalidArgument, PermissionDenied

NODES = [f"n{i}" for i in range(6)]


def _reaches(edges: dict[str, tuple[str, ...]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo += edges.get(node, ())
    return False


@given(
    st.dictionaries(st.sampled_from(NODES), st.lists(st.sampled_from(NODES), unique=True)),
    st.sampled_from(NODES),
    st.lists(st.sampled_from(NODES), unique=True, max_size=3),
)
def test_find_cycle_agrees_with_reachability(
    graph: dict[str, list[str]], task: str, depends_on: list[str]
) -> None:
    edges = {node: tuple(ups) for node, ups in graph.items() if node != task}
    cycle = find_cycle(task, depends_on, edges)
    closes = any(_reaches(edges, upstream, task) for upstream in depends_on)
    assert (cycle is not None) == closes
    if cycle is not None:
        assert cycle[0] == cycle[-1] == task
        assert cycle[1] in depends_on
        for a, b in itertools.pairwise(cycle[1:]):
            assert b in edges[a]  # every step is a real edge


def test_find_cycle_returns_the_shortest_named_path() -> None:
    edges = {"b": ("c", "a"), "c": ("a",)}
    assert format_cycle(find_cycle("a", ["b"], edges) or []) == "a -> b -> a"
    assert find_cycle("a", ["b"], {"b": ("c",)}) is None


def test_a_long_cycle_is_named_by_its_ends_and_its_length() -> None:
    assert format_cycle(["a", "b", "c", "d", "e", "f", "a"]) == "a -> b -> c -> d -> e -> f -> a"
    long = ["t0", *(f"t{n}" for n in range(4999, 0, -1)), "t0"]
    named = format_cycle(long)
    assert named == "t0 -> t4999 -> t4998 -> ... -> t2 -> t1 -> t0 (a cycle of 5000 tasks)"
    assert len(format_cycle(["x" * 128] * 10_001)) < 1024  # bounded whatever the ids


def test_check_dependencies_refuses_malformed_lists() -> None:
    assert check_dependencies("t", ["a", "b"]) == ("a", "b")
    assert check_dependencies("", []) == ()
    for bad, message in [
        (["a", "a"], "lists 'a' twice"),
        (["t"], r"names the task itself \(t -> t\)"),
        ([""], r"depends_on\[0\] is required"),
        (["a/b"], r"depends_on\[0\] must be"),
        ([f"u{n}" for n in range(51)], "the limit is 50"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            check_dependencies("t", bad)


def _task(state: TaskState, revision: int = 1, review: bool = True) -> TaskRecord:
    return TaskRecord("t", "q", "sha256:x", state, revision=revision, requires_review=review)


def _result(owner: str = "w1", revision: int = 1) -> ResultRecord:
    return ResultRecord("t", revision, "a1-x", 7, 1, owner, "sha256:r", 1.0)


@pytest.mark.parametrize("decision", list(ReviewDecision))
def test_check_review(decision: ReviewDecision) -> None:
    apply = check_review(
        _task(TaskState.REVIEW), _result(), decision=decision, revision=1, reviewer="pm"
    )
    assert apply is ReviewAction.APPLY
    with pytest.raises(PermissionDenied):
        check_review(
            _task(TaskState.REVIEW), _result(), decision=decision, revision=1, reviewer="w1"
        )
    with pytest.raises(FailedPrecondition, match="revision 1 does not apply to revision 2"):
        check_review(
            _task(TaskState.REVIEW, 2),
            _result(revision=2),
            decision=decision,
            revision=1,
            reviewer="pm",
        )
    with pytest.raises(FailedPrecondition, match="requires_review"):
        check_review(
            _task(TaskState.DONE, review=False),
            _result(),
            decision=decision,
            revision=1,
            reviewer="pm",
        )
    with pytest.raises(FailedPrecondition, match="no canonical result"):
        check_review(_task(TaskState.REVIEW), None, decision=decision, revision=1, reviewer="pm")
    for state in (TaskState.READY, TaskState.CLAIMED, TaskState.CANCELLED):
        with pytest.raises(FailedPrecondition, match="only a task in REVIEW"):
            check_review(_task(state), None, decision=decision, revision=1, reviewer="pm")


def test_an_accepted_revision_accepted_again_is_already_applied() -> None:
    done = check_review(
        _task(TaskState.DONE),
        _result(),
        decision=ReviewDecision.ACCEPT,
        revision=1,
        reviewer="pm",
    )
    assert done is ReviewAction.ALREADY_APPLIED
    with pytest.raises(FailedPrecondition):
        check_review(
            _task(TaskState.DONE),
            _result(),
            decision=ReviewDecision.REJECT,
            revision=1,
            reviewer="pm",
        )


def test_idempotency_decisions() -> None:
    m, d = "/svc/Method", "sha256:1"
    pending = IdemRecord(m, d, IdemState.PENDING, 1.0)
    done = IdemRecord(m, d, IdemState.DONE, 1.0, response=b"r")
    assert decide(None, method=m, digest=d) is IdemAction.RUN
    assert decide(pending, method=m, digest=d) is IdemAction.IN_FLIGHT
    assert decide(done, method=m, digest=d) is IdemAction.REPLAY
    assert decide(done, method=m, digest="sha256:2") is IdemAction.CONFLICT
    assert decide(pending, method="/svc/Other", digest=d) is IdemAction.CONFLICT
