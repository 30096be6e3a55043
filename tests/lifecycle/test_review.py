"""Review: a report is not an acceptance; a review binds to one revision; the executor cannot
accept its own work. Store-level tests, each invariant its own test."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.domain.digests import digest_of
from coordinator.domain.records import ResultRecord, decode
from coordinator.domain.states import Op, Outcome, TaskState
from coordinator.errors import FailedPrecondition, PermissionDenied
from coordinator.store import Store
from tests.lifecycle.support import claim, commit, create, events, finish, snapshot


def test_a_report_does_not_create_acceptance(store: Store, etcd_client: Any) -> None:
    create(store, "up", review=True)
    create(store, "down", depends_on=("up",))
    task = finish(store, "up", "w1")
    # The executor's commit is a report: the task waits for a reviewer, and nothing downstream
    # moves, however long we look.
    assert task.state is TaskState.REVIEW
    assert task.result_commit_id
    assert store.releaser.scan() == 0
    assert store.tasks.get("down").state is TaskState.WAITING
    assert [e.op for e in events(store, etcd_client, "up")][-1] is Op.COMMIT
    assert store.claims.claim("down", principal="w2", epoch=1, ttl=30).verdict.outcome is (
        Outcome.NOT_CLAIMABLE
    )


def test_old_revision_approval_does_not_apply(store: Store, etcd_client: Any) -> None:
    create(store, "t", review=True)
    finish(store, "t", "w1")
    rejected = store.review.reject("t", revision=1, reviewer="pm", reason="missing the CSV tests")
    assert (rejected.state, rejected.revision) == (TaskState.READY, 2)
    finish(store, "t", "w2")
    before = snapshot(store, etcd_client)
    # An approval prepared for revision 1 must not land on revision 2.
    with pytest.raises(FailedPrecondition) as refused:
        store.review.accept("t", revision=1, reviewer="pm")
    assert "revision 1" in str(refused.value)
    assert "revision 2" in str(refused.value)
    assert snapshot(store, etcd_client) == before
    assert store.tasks.get("t").state is TaskState.REVIEW
    # The reviewer who looks at revision 2 can accept it.
    assert store.review.accept("t", revision=2, reviewer="pm").state is TaskState.DONE


def test_executor_cannot_close_work_that_needs_independent_acceptance(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t", review=True)
    fence = claim(store, "t", "w1")
    assert commit(store, fence, "w1") is Outcome.COMMITTED
    # Reporting again (a retried commit) is answered COMMITTED and still closes nothing.
    assert commit(store, fence, "w1") is Outcome.COMMITTED
    assert store.tasks.get("t").state is TaskState.REVIEW
    before = snapshot(store, etcd_client)
    with pytest.raises(PermissionDenied, match=r"'w1' committed revision 1"):
        store.review.accept("t", revision=1, reviewer="w1")
    with pytest.raises(PermissionDenied):
        store.review.reject("t", revision=1, reviewer="w1", reason="mine")
    assert snapshot(store, etcd_client) == before
    assert store.tasks.get("t").state is TaskState.REVIEW
    assert store.review.accept("t", revision=1, reviewer="pm2").state is TaskState.DONE


def test_reject_opens_a_new_round_and_keeps_the_old_result(store: Store, etcd_client: Any) -> None:
    create(store, "t", review=True)
    first = finish(store, "t", "w1")
    store.review.reject("t", revision=1, reviewer="pm", reason="wrong encoding")
    task = store.tasks.get("t")
    assert (task.state, task.revision, task.result_commit_id) == (TaskState.READY, 2, "")
    assert store.ready.size("default") == 1  # back in the ready index
    kept = etcd_client.get(store.ctx.keys.result("t", 1))[0]
    assert decode(ResultRecord, kept).commit_id == first.result_commit_id
    # The old round's attempt cannot commit into the new round.
    fence = claim(store, "t", "w2")
    assert commit(store, fence, "w2", b"second report") is Outcome.COMMITTED
    second = decode(ResultRecord, etcd_client.get(store.ctx.keys.result("t", 2))[0])
    assert (second.revision, second.result_digest) == (2, digest_of(b"second report"))
    reject = events(store, etcd_client, "t")[-3]
    assert (reject.op, reject.from_state, reject.to_state, reject.by) == (
        Op.REJECT,
        TaskState.REVIEW,
        TaskState.READY,
        "pm",
    )
    assert reject.detail == "rejected revision 1: wrong encoding"


def test_a_retried_accept_is_answered_without_a_second_write(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t", review=True)
    finish(store, "t")
    done = store.review.accept("t", revision=1, reviewer="pm")
    before = snapshot(store, etcd_client)
    again = store.review.accept("t", revision=1, reviewer="pm")
    assert (again.state, again.state_version) == (TaskState.DONE, done.state_version)
    assert snapshot(store, etcd_client) == before
    with pytest.raises(FailedPrecondition, match="only a task in REVIEW"):
        store.review.reject("t", revision=1, reviewer="pm", reason="too late")


def test_review_of_a_task_without_requires_review_is_refused(store: Store) -> None:
    create(store, "t")
    finish(store, "t")
    with pytest.raises(FailedPrecondition, match="requires_review"):
        store.review.accept("t", revision=1, reviewer="pm")
