"""Producer operations (create, get, list, cancel, update input) and the event log."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import AttemptEnd, Op, Outcome, TaskState
from coordinator.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from coordinator.store import CommitResult, Store, TaskSpec
from tests.store.support import (
    claim,
    claim_result,
    commit,
    create,
    events,
    raw,
    results,
    under,
)


def test_create_writes_a_ready_task_its_ready_key_and_one_event(
    store: Store, etcd_client: Any, clock: ManualClock
) -> None:
    task = store.tasks.create(TaskSpec(task_id="t1", queue="q", priority=7, input=b"x"), by="pm")
    assert task == store.tasks.get("t1")
    assert (task.state, task.revision, task.input, task.input_digest) == (
        TaskState.READY,
        1,
        b"x",
        digest_of(b"x"),
    )
    assert (task.attempt, task.claim_generation, task.cancel_generation) == (0, 0, 0)
    assert task.state_version == raw(etcd_client, store.ctx.keys.task("t1")).mod_revision
    assert task.created_at == clock.now()
    ready_key = store.ctx.keys.ready("q", 7, task.ready_seq, "t1")
    assert raw(etcd_client, ready_key) is not None
    assert store.ready.first("q", 5) == [ready_key]
    (event,) = events(store, etcd_client, "t1")
    assert (event.op, event.from_state, event.to_state, event.by) == (
        Op.CREATE,
        None,
        TaskState.READY,
        "pm",
    )


def test_create_refuses_a_taken_id_and_a_wrong_digest(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    with pytest.raises(AlreadyExists):
        create(store, "t1", data=b"other")
    with pytest.raises(InvalidArgument):
        store.tasks.create(
            TaskSpec(task_id="t2", input=b"x", input_digest=digest_of(b"y")), by="pm"
        )
    assert store.tasks.get("t1").input == b"input of t1"
    with pytest.raises(NotFound):
        store.tasks.get("t2")
    assert len(events(store, etcd_client, "t1")) == 1


def test_each_transition_writes_exactly_one_event(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    log: list[tuple[Op, TaskState | None, TaskState]] = [(Op.CREATE, None, TaskState.READY)]

    def step(op: Op, before: TaskState, after: TaskState) -> None:
        log.append((op, before, after))
        assert [(e.op, e.from_state, e.to_state) for e in events(store, etcd_client, "t1")] == log

    first = claim(store, "t1")
    step(Op.CLAIM, TaskState.READY, TaskState.CLAIMED)
    # Calls that are not transitions write no event.
    store.renewals.renew(first, principal="w1", progress="p")
    store.acceptance.authorize_tool(first, principal="w1", tool="t", action="a")
    store.acceptance.stage_result(
        first, principal="w1", result_digest=digest_of(b"r"), result=b"r", result_ref=""
    )
    assert claim_result(store, "t1", principal="w2").verdict.outcome is Outcome.ALREADY_CLAIMED
    assert len(events(store, etcd_client, "t1")) == 2
    store.acceptance.release(first, principal="w1", reason="")
    step(Op.RELEASE, TaskState.CLAIMED, TaskState.READY)
    claim(store, "t1")
    step(Op.CLAIM, TaskState.READY, TaskState.CLAIMED)
    store.tasks.update_input(
        "t1", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=1, by="pm"
    )
    step(Op.UPDATE_INPUT, TaskState.CLAIMED, TaskState.READY)
    last = claim(store, "t1")
    step(Op.CLAIM, TaskState.READY, TaskState.CLAIMED)
    assert commit(store, last).verdict.outcome is Outcome.COMMITTED
    step(Op.COMMIT, TaskState.CLAIMED, TaskState.DONE)
    assert commit(store, last).verdict.outcome is Outcome.COMMITTED  # a retry is no transition
    assert len(events(store, etcd_client, "t1")) == len(log) == 7
    commit_event = events(store, etcd_client, "t1")[-1]
    assert (commit_event.attempt_id, commit_event.claim_generation) == (
        last.attempt_id,
        last.claim_generation,
    )


def test_cancel_ends_a_live_claim(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    fence = claim(store, "t1")
    lease_id = store.tasks.get("t1").lease_id
    task = store.tasks.cancel("t1", by="pm", reason="not needed")
    assert (task.state, task.cancel_generation) == (TaskState.CANCELLED, 1)
    assert raw(etcd_client, store.ctx.keys.claim("t1")) is None
    assert etcd_client.get_lease_info(lease_id).TTL == -1
    (attempt,) = store.tasks.attempts("t1")
    assert attempt.end is AttemptEnd.CANCELLED
    assert commit(store, fence).verdict.outcome is Outcome.CANCELLED
    assert results(store, etcd_client) == []
    assert store.tasks.cancel("t1", by="pm", reason="again").cancel_generation == 1
    assert [e.op for e in events(store, etcd_client, "t1")] == [Op.CREATE, Op.CLAIM, Op.CANCEL]


def test_cancel_of_a_ready_task_removes_it_from_the_queue(store: Store, etcd_client: Any) -> None:
    create(store, "t1")
    store.tasks.cancel("t1", by="pm", reason="")
    assert under(etcd_client, store.ctx.keys.ready_prefix()) == {}
    next_claim = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert next_claim.verdict.outcome is Outcome.NO_READY_TASK


def test_a_done_task_cannot_be_cancelled(store: Store) -> None:
    create(store, "t1")
    assert commit(store, claim(store, "t1")).verdict.outcome is Outcome.COMMITTED
    with pytest.raises(FailedPrecondition):
        store.tasks.cancel("t1", by="pm", reason="")
    assert store.tasks.get("t1").state is TaskState.DONE


def _cancel_and_commit_at_once(
    store: Store, fence: Fence, *, cancel_head_start: float = 0.0
) -> tuple[CommitResult, TaskRecord | FailedPrecondition]:
    barrier = threading.Barrier(2)
    input_digest = store.tasks.get(fence.task_id).input_digest

    def do_commit() -> CommitResult:
        barrier.wait()
        threading.Event().wait(cancel_head_start)
        return commit(store, fence, input_digest=input_digest)

    def do_cancel() -> TaskRecord | FailedPrecondition:
        barrier.wait()
        try:
            return store.tasks.cancel(fence.task_id, by="pm", reason="race")
        except FailedPrecondition as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        committed, cancelled = pool.submit(do_commit), pool.submit(do_cancel)
        return committed.result(timeout=30), cancelled.result(timeout=30)


# How long the commit waits after the barrier: from none (the commit usually wins: the cancel
# reads the task before its txn) to past a cancel's round trip (the cancel wins), with the
# near-ties (about 1-2 ms here) in between, so both orders occur across the rounds.
HEAD_STARTS = (0.0, 0.0005, 0.001, 0.0015, 0.002, 0.003, 0.01, 0.02)


def test_cancel_racing_commit_has_exactly_one_winner(store: Store, etcd_client: Any) -> None:
    tally: Counter[str] = Counter()
    for n in range(40):
        task_id = f"t{n}"
        create(store, task_id)
        committed, cancelled = _cancel_and_commit_at_once(
            store, claim(store, task_id), cancel_head_start=HEAD_STARTS[n % len(HEAD_STARTS)]
        )
        task = store.tasks.get(task_id)
        result_key = raw(etcd_client, store.ctx.keys.result(task_id, 1))
        if committed.verdict.outcome is Outcome.COMMITTED:
            assert isinstance(cancelled, FailedPrecondition), (n, cancelled)
            assert (task.state, result_key is not None) == (TaskState.DONE, True), n
            tally["committed"] += 1
        else:
            assert committed.verdict.outcome is Outcome.CANCELLED, (n, committed)
            assert isinstance(cancelled, TaskRecord), (n, cancelled)
            assert cancelled.state is TaskState.CANCELLED, n
            assert (task.state, result_key) == (TaskState.CANCELLED, None), n
            tally["cancelled"] += 1
    assert sum(tally.values()) == 40, tally
    assert tally["committed"] > 0 and tally["cancelled"] > 0, tally  # both orders were raced


def test_update_input_makes_the_running_attempt_stale(store: Store, etcd_client: Any) -> None:
    create(store, "t1", data=b"v1")
    fence = claim(store, "t1")
    task = store.tasks.update_input(
        "t1", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=1, by="pm"
    )
    assert (task.state, task.revision, task.input_digest) == (
        TaskState.READY,
        2,
        digest_of(b"v2"),
    )
    assert raw(etcd_client, store.ctx.keys.claim("t1")) is None
    (attempt,) = store.tasks.attempts("t1")
    assert attempt.end is AttemptEnd.STALE_INPUT
    for executed_on in (digest_of(b"v1"), digest_of(b"v2")):
        stale = commit(store, fence, input_digest=executed_on)
        assert stale.verdict.outcome is Outcome.STALE_INPUT, executed_on
    assert results(store, etcd_client) == []
    fresh = claim_result(store, "t1", principal="w2")
    assert fresh.fence is not None and fresh.task is not None
    assert (fresh.task.revision, fresh.task.input) == (2, b"v2")
    assert commit(store, fresh.fence, principal="w2").verdict.outcome is Outcome.COMMITTED
    (canonical,) = results(store, etcd_client)
    assert (canonical.revision, canonical.attempt_id) == (2, fresh.fence.attempt_id)


def test_update_input_of_a_ready_task(store: Store, etcd_client: Any) -> None:
    create(store, "t1", data=b"v1")
    task = store.tasks.update_input(
        "t1", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=1, by="pm"
    )
    assert (task.state, task.revision, task.input) == (TaskState.READY, 2, b"v2")
    assert len(under(etcd_client, store.ctx.keys.ready_prefix())) == 1
    fresh = claim_result(store, "t1")
    assert fresh.task is not None and fresh.task.input == b"v2"


def test_update_input_refusals(store: Store) -> None:
    create(store, "t1", data=b"v1")
    with pytest.raises(InvalidArgument):
        store.tasks.update_input(
            "t1", data=b"v1", input_digest=digest_of(b"v1"), expected_revision=1, by="pm"
        )
    with pytest.raises(FailedPrecondition):
        store.tasks.update_input(
            "t1", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=5, by="pm"
        )
    assert store.tasks.get("t1").revision == 1


def test_list_filters_and_pages(store: Store) -> None:
    for n in range(5):
        create(store, f"a{n}", queue="qa")
    create(store, "b0", queue="qb")
    claim(store, "a1")
    page, token = store.tasks.list(queue="qa", page_size=2)
    assert ([t.task_id for t in page], token) == (["a0", "a1"], "a1")
    page, token = store.tasks.list(queue="qa", page_size=2, page_token=token)
    assert ([t.task_id for t in page], token) == (["a2", "a3"], "a3")
    page, token = store.tasks.list(queue="qa", page_size=2, page_token=token)
    assert ([t.task_id for t in page], token) == (["a4"], "")
    claimed, _ = store.tasks.list(state=TaskState.CLAIMED)
    assert [t.task_id for t in claimed] == ["a1"]
    everything, token = store.tasks.list(page_size=100)
    assert (len(everything), token) == (6, "")
