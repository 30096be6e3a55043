"""coordinator.domain.waiting: a FAILED or CANCELLED upstream blocks, never ends, a dependent;
a WAITING task's deadline marks it overdue and is waived when it is released."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState, WaitingReason
from coordinator.domain.waiting import (
    KeepWaiting,
    Reblock,
    Release,
    blocking,
    describe_blocked,
    is_overdue,
    released,
    settle,
    waiting_reason,
)


def _task(task_id: str, state: TaskState, **fields: Any) -> TaskRecord:
    return replace(TaskRecord(task_id=task_id, queue="q", input_digest="d", state=state), **fields)


def _down(*depends_on: str, blocked_by: tuple[str, ...] = ()) -> TaskRecord:
    return _task("down", TaskState.WAITING, depends_on=depends_on, blocked_by=blocked_by)


def test_all_upstreams_done_release_with_their_rounds() -> None:
    ups = [_task("a", TaskState.DONE, revision=2), _task("b", TaskState.DONE)]
    assert settle(_down("a", "b"), ups) == Release(("a@2", "b@1"))


def test_a_failed_or_cancelled_upstream_blocks_in_depends_on_order() -> None:
    ups = [
        _task("a", TaskState.CANCELLED),
        _task("b", TaskState.READY),
        _task("c", TaskState.FAILED),
    ]
    assert settle(_down("a", "b", "c"), ups) == Reblock(("a", "c"))


def test_a_current_mark_writes_nothing() -> None:
    ups = [_task("a", TaskState.FAILED), _task("b", TaskState.DONE)]
    assert settle(_down("a", "b", blocked_by=("a",)), ups) == KeepWaiting()
    assert settle(_down("b"), [_task("b", TaskState.CLAIMED)]) == KeepWaiting()


def test_a_retried_upstream_clears_the_mark_before_anything_is_released() -> None:
    # Retried and already committed: the mark is cleared first, the release follows.
    ups = [_task("a", TaskState.DONE)]
    assert settle(_down("a", blocked_by=("a",)), ups) == Reblock(())
    assert settle(_down("a"), ups) == Release(("a@1",))


@given(st.lists(st.sampled_from(list(TaskState)), min_size=1, max_size=6))
def test_settle_never_releases_past_a_blocking_upstream(states: list[TaskState]) -> None:
    ups = [_task(f"u{i}", s) for i, s in enumerate(states)]
    down = _down(*(u.task_id for u in ups), blocked_by=blocking(ups))
    decision = settle(down, ups)
    if any(s in (TaskState.FAILED, TaskState.CANCELLED) for s in states):
        assert decision == KeepWaiting()
    elif all(s is TaskState.DONE for s in states):
        assert isinstance(decision, Release)
    else:
        assert decision == KeepWaiting()


def test_the_waiting_reason_follows_state_and_mark() -> None:
    assert waiting_reason(_down("a")) is WaitingReason.UPSTREAMS_PENDING
    assert waiting_reason(_down("a", blocked_by=("a",))) is WaitingReason.UPSTREAM_FAILED
    assert waiting_reason(_task("t", TaskState.READY)) is WaitingReason.NONE


def test_the_blocked_detail_names_each_upstream_and_its_state() -> None:
    ups = [_task("a", TaskState.FAILED), _task("b", TaskState.CANCELLED)]
    assert describe_blocked("down", ups, ("a", "b")) == (
        "blocked by a (FAILED), b (CANCELLED): down stays WAITING until each is DONE; retry a "
        "FAILED one (`tasks retry`); a CANCELLED one never runs again: change down's upstreams "
        "(`tasks deps down --set`/`--clear`) or cancel down"
    )
    # A CANCELLED upstream cannot be retried (FAILED_PRECONDITION): the detail said it could.
    assert describe_blocked("down", ups[1:], ("b",)).endswith(
        "until each is DONE; a CANCELLED one never runs again: change down's upstreams "
        "(`tasks deps down --set`/`--clear`) or cancel down"
    )
    assert describe_blocked("down", ups[:1], ("a",)).endswith(
        "until each is DONE; retry a FAILED one (`tasks retry`)"
    )
    assert describe_blocked("down", ups, ()).startswith("no upstream is FAILED or CANCELLED")


def test_only_a_waiting_task_past_its_deadline_and_not_marked_is_overdue() -> None:
    waiting = _task("t", TaskState.WAITING, deadline=10.0)
    assert is_overdue(waiting, 10.0)
    assert not is_overdue(waiting, 9.9)
    assert not is_overdue(replace(waiting, overdue_at=10.0), 11.0)
    assert not is_overdue(replace(waiting, deadline=0.0), 11.0)
    # A task that can run is timed out, not marked overdue.
    assert not is_overdue(replace(waiting, state=TaskState.READY), 11.0)


def test_a_release_waives_a_passed_deadline_and_keeps_a_future_one() -> None:
    marked = _task("t", TaskState.READY, deadline=10.0, overdue_at=10.5, blocked_by=("a",))
    assert released(marked, 20.0) == replace(marked, deadline=0.0, blocked_by=())
    # Passed but the deadline pass has not marked it yet: marked now, waived all the same.
    unmarked = _task("t", TaskState.READY, deadline=10.0)
    assert released(unmarked, 20.0) == replace(unmarked, deadline=0.0, overdue_at=20.0)
    ahead = _task("t", TaskState.READY, deadline=30.0)
    assert released(ahead, 20.0) == ahead
