"""``recorded_attempt``: the attempt a task record of schema 3 holds (pure)."""

from __future__ import annotations

from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.records import AttemptRecord, TaskRecord, with_changes
from coordinator.domain.states import AttemptEnd, TaskState

CLAIMED = TaskRecord(
    task_id="t",
    queue="q",
    input_digest="sha256:d",
    state=TaskState.CLAIMED,
    revision=2,
    claim_generation=41,
    scheduler_epoch=3,
    attempt=4,
    attempt_id="a4-x",
    owner_id="w1",
    updated_at=100.0,
    attempt_in_record=True,
    attempt_ttl=30,
    attempt_started_at=100.0,
)
RUNNING = AttemptRecord(
    task_id="t",
    attempt_id="a4-x",
    attempt=4,
    owner_id="w1",
    revision=2,
    input_digest="sha256:d",
    scheduler_epoch=3,
    ttl=30,
    started_at=100.0,
    claim_generation=41,
)


def test_a_claimed_record_holds_its_running_attempt() -> None:
    assert recorded_attempt(CLAIMED) == RUNNING


def test_a_committed_record_holds_the_attempt_ended_at_the_commit() -> None:
    done = with_changes(CLAIMED, state=TaskState.DONE, updated_at=107.5)
    committed = with_changes(RUNNING, end=AttemptEnd.COMMITTED, ended_at=107.5)
    assert recorded_attempt(done) == committed
    review = with_changes(done, state=TaskState.REVIEW)
    assert recorded_attempt(review) == committed


def test_a_record_that_does_not_say_so_holds_no_attempt() -> None:
    assert recorded_attempt(with_changes(CLAIMED, attempt_in_record=False)) is None
    never = with_changes(CLAIMED, state=TaskState.READY, attempt=0, attempt_id="")
    assert recorded_attempt(never) is None
