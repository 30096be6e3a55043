"""Only enumerated transitions: through the store, every (state, operation) pair the table does
not list is refused and writes nothing; every pair it lists moves the task exactly as the
table says and appends exactly one event. Current state is read from one place.

States built: WAITING, READY, CLAIMED, REVIEW, DONE, CANCELLED (no operation leads to FAILED;
NEEDS_APPROVAL and its operations, hold_for_approval and approve_retry, belong to the effects
work and are tested there).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.states import TRANSITIONS, Op, Outcome, TaskState
from coordinator.errors import CoordinatorError
from coordinator.store import Store
from tests.lifecycle.support import claim, commit, create, events, finish, snapshot

T = "t"


class Case:
    """A task ``t`` in some state, plus what the attempts need (its last fence, helpers)."""

    def __init__(self, store: Store, etcd_client: Any) -> None:
        self.store = store
        self.raw = etcd_client
        self.fence: Fence | None = None
        store.reclaimer.close()  # expiries below are the test's, not the reclaimer's
        create(store, "blocker")  # READY forever: an unmet upstream
        create(store, "finished")
        finish(store, "finished", "w9")

    def expire(self) -> None:
        """End t's claim lease the way a TTL does (etcd deletes the claim key)."""
        _, meta = self.raw.get(self.store.ctx.keys.claim(T))
        if meta is not None:
            self.raw.revoke_lease(meta.lease_id)


def _in_state(case: Case, state: TaskState) -> None:
    store = case.store
    if state is TaskState.WAITING:
        create(store, T)
        case.fence = claim(store, T)
        store.acceptance.release(case.fence, principal="w1", reason="")
        store.dependencies.set_dependencies(T, ("blocker",), expected_state_version=0, by="pm")
    elif state is TaskState.READY:
        create(store, T)
        case.fence = claim(store, T)
        store.acceptance.release(case.fence, principal="w1", reason="")
    elif state is TaskState.CLAIMED:
        create(store, T)
        case.fence = claim(store, T)
    elif state in (TaskState.REVIEW, TaskState.DONE):
        create(store, T, review=True)
        case.fence = claim(store, T)
        assert commit(store, case.fence) is Outcome.COMMITTED
        if state is TaskState.DONE:
            store.review.accept(T, revision=1, reviewer="pm")
    elif state is TaskState.CANCELLED:
        create(store, T)
        case.fence = claim(store, T)
        store.tasks.cancel(T, by="pm", reason="")
    assert store.tasks.get(T).state is state


def _claim(case: Case) -> None:
    if case.store.tasks.get(T).state is TaskState.CLAIMED:
        case.expire()  # the only legal claim of a CLAIMED task is over an expired lease
    case.store.claims.claim(T, principal="w2", epoch=1, ttl=30)


def _commit(case: Case) -> None:
    assert case.fence is not None
    task = case.store.tasks.get(T)
    case.store.acceptance.commit(
        case.fence,
        principal="w1",
        input_digest=task.input_digest,
        result_digest=digest_of(b"another report"),
        result=b"another report",
        result_ref="",
    )


def _release(case: Case) -> None:
    assert case.fence is not None
    case.store.acceptance.release(case.fence, principal="w1", reason="")


def _reclaim(case: Case) -> None:
    case.expire()
    case.store.reclaimer.reclaim(T)


def _cancel(case: Case) -> None:
    case.store.tasks.cancel(T, by="pm", reason="")


def _update_input(case: Case) -> None:
    data = b"a new input"
    case.store.tasks.update_input(
        T, data=data, input_digest=digest_of(data), expected_revision=0, by="pm"
    )


def _accept(case: Case) -> None:
    case.store.review.accept(T, revision=1, reviewer="pm")


def _reject(case: Case) -> None:
    case.store.review.reject(T, revision=1, reviewer="pm", reason="redo")


def _create_again(case: Case) -> None:
    create(case.store, T)


def _block(case: Case) -> None:
    case.store.dependencies.set_dependencies(T, ("blocker",), expected_state_version=0, by="pm")


def _unblock(case: Case) -> None:
    if case.store.tasks.get(T).state is TaskState.WAITING:
        # Out of WAITING: the edge to the unfinished upstream is replaced by a finished one.
        case.store.dependencies.set_dependencies(
            T, ("finished",), expected_state_version=0, by="pm"
        )
    else:
        case.store.releaser.release(T)


def _set_dependencies(case: Case) -> None:
    state = case.store.tasks.get(T).state
    deps = ("finished",) if state is TaskState.READY else ("blocker", "finished")
    case.store.dependencies.set_dependencies(T, deps, expected_state_version=0, by="pm")


ATTEMPTS: dict[Op, Callable[[Case], None]] = {
    Op.CREATE: _create_again,
    Op.CREATE_WAITING: _create_again,
    Op.CLAIM: _claim,
    Op.COMMIT: _commit,
    Op.RELEASE: _release,
    Op.RECLAIM: _reclaim,
    Op.CANCEL: _cancel,
    Op.UPDATE_INPUT: _update_input,
    Op.ACCEPT: _accept,
    Op.REJECT: _reject,
    Op.BLOCK: _block,
    Op.UNBLOCK: _unblock,
    Op.SET_DEPENDENCIES: _set_dependencies,
}
STATES = [
    TaskState.WAITING,
    TaskState.READY,
    TaskState.CLAIMED,
    TaskState.REVIEW,
    TaskState.DONE,
    TaskState.CANCELLED,
]
ILLEGAL = [(s, op) for s in STATES for op in ATTEMPTS if (s, op) not in TRANSITIONS]
LEGAL = [(s, op) for s in STATES for op in ATTEMPTS if (s, op) in TRANSITIONS]


def test_the_attempts_cover_every_operation_of_this_issue_and_the_core() -> None:
    elsewhere = _EFFECT_OPS | _QUEUE_OPS
    assert set(Op) - set(ATTEMPTS) <= {op for op in Op if op.value in elsewhere}
    assert len(ILLEGAL) + len(LEGAL) == len(STATES) * len(ATTEMPTS)


_EFFECT_OPS = {"hold_for_approval", "approve_retry", "escalate_reconcile"}  # tests/reconcile
# The retry policy's moves, the delayed index, RetryTask and an undelivered claim given back:
# tests/workqueue.
_QUEUE_OPS = {
    "fail",
    "dead_letter",
    "backoff",
    "promote",
    "create_delayed",
    "retry",
    "time_out",
    "give_back",
}
# Marks on a WAITING task (blocked, overdue): tests/workqueue/test_blocked_dependents.py.
_QUEUE_OPS |= {"mark_blocked", "mark_overdue"}


@pytest.mark.parametrize(("state", "op"), ILLEGAL, ids=lambda v: getattr(v, "name", str(v)))
def test_only_enumerated_transitions_an_illegal_one_is_refused(
    state: TaskState, op: Op, store: Store, etcd_client: Any
) -> None:
    case = Case(store, etcd_client)
    _in_state(case, state)
    before = snapshot(store, etcd_client)
    with contextlib.suppress(CoordinatorError):  # refused as an error, or as an outcome
        ATTEMPTS[op](case)
    assert snapshot(store, etcd_client) == before  # nothing written, not even an event
    assert store.tasks.get(T).state is state


@pytest.mark.parametrize(("state", "op"), LEGAL, ids=lambda v: getattr(v, "name", str(v)))
def test_each_listed_transition_moves_as_the_table_says_with_one_event(
    state: TaskState, op: Op, store: Store, etcd_client: Any
) -> None:
    case = Case(store, etcd_client)
    _in_state(case, state)
    count = len(events(store, etcd_client, T))
    ATTEMPTS[op](case)
    task = store.tasks.get(T)
    new = [(e.op, e.from_state, e.to_state) for e in events(store, etcd_client, T)[count:]]
    assert new == [(op, state, TRANSITIONS[(state, op)])]
    assert task.state is TRANSITIONS[(state, op)]


def test_current_state_is_read_from_the_task_record_only(store: Store, etcd_client: Any) -> None:
    create(store, T)
    fence = claim(store, T)
    # A stale ready-index entry (a manual edit, a bug) does not make a CLAIMED task claimable:
    # every claim compares the record itself.
    task = store.tasks.get(T)
    stale = store.ctx.keys.ready("default", 0, 1, T)
    etcd_client.put(stale, b"")
    store.ready.add(stale)
    assert store.claims.claim_next("default", principal="w2", epoch=1, ttl=30).verdict.outcome is (
        Outcome.NO_READY_TASK
    )
    assert store.claims.claim(T, principal="w2", epoch=1, ttl=30).verdict.outcome is (
        Outcome.ALREADY_CLAIMED
    )
    assert store.tasks.get(T) == task
    assert store.tasks.get(T).state is TaskState.CLAIMED
    assert commit(store, fence) is Outcome.COMMITTED
