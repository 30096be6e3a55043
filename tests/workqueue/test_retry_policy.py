"""The retry policy applied by every attempt end (expiry, release, fail, takeover), the delayed
index and its promoter, on a real etcd with a manual clock (lease expiry is real: a revoked
lease deletes the claim key exactly as an expired one does)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from structlog.testing import capture_logs

from coordinator.clock import ManualClock
from coordinator.domain.failures import KEPT_MESSAGE, FailureReport
from coordinator.domain.records import EventRecord, decode
from coordinator.domain.retry import attempts_counted
from coordinator.domain.space import RETRIES_ABOVE_HIGH_WATER, SpaceState
from coordinator.domain.states import AttemptEnd, DeadLetterReason, Op, Outcome, TaskState
from coordinator.errors import StoreUnavailable
from coordinator.metrics import METRICS
from coordinator.store import Store, TaskSpec
from coordinator.store.etcd.ops import KV
from tests.helpers import eventually
from tests.store.support import LIMITS, StoreFactory, claim, claim_result

BACKOFF = (("initial_backoff", 10.0), ("backoff_multiplier", 2.0), ("max_backoff", 300.0))
NOT_DUE = 150  # DELAYED tasks not yet due: a pass that read them would show it


def _create(store: Store, task_id: str, *policy: tuple[str, Any], not_before: float = 0) -> None:
    spec = TaskSpec(task_id=task_id, input=b"x", retry=tuple(policy), not_before=not_before)
    store.tasks.create(spec, by="pm")


def _events(store: Store, etcd_client: Any, task_id: str) -> list[EventRecord]:
    found = {
        meta.key.decode(): value
        for value, meta in etcd_client.get_prefix(store.ctx.keys.events_prefix(task_id))
    }
    return [decode(EventRecord, found[key]) for key in sorted(found)]


def _expire(store: Store, task_id: str) -> None:
    """End the holder's lease as etcd does at expiry (its claim key goes with it)."""
    store.ctx.kv.revoke(store.tasks.get(task_id).lease_id)


def _state(store: Store, task_id: str, *states: TaskState) -> TaskState:
    state = store.tasks.get(task_id).state
    assert state in states, state
    return state


def _dead_letters(store: Store, queue: str, reason: str) -> float:
    labels = {"queue": queue, "reason": reason}
    registry = store.ctx.metrics.registry
    return registry.get_sample_value("coordinator_tasks_dead_lettered_total", labels) or 0


def test_a_poison_task_reaches_failed_after_exactly_max_attempts_each_after_its_backoff(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    store = make_store()
    _create(store, "poison", ("max_attempts", 3), *BACKOFF)
    ended_at = 0.0
    for number, wait in ((1, 10.0), (2, 20.0), (3, 0.0)):
        fence = claim(store, "poison")
        [attempt] = store.tasks.attempts("poison", first=number, count=1)
        assert attempt.attempt_id == fence.attempt_id
        if number > 1:  # started no earlier than the previous end plus its backoff
            assert attempt.started_at >= ended_at + {2: 10.0, 3: 20.0}[number]
        _expire(store, "poison")
        eventually(lambda: _state(store, "poison", TaskState.DELAYED, TaskState.FAILED))
        ended_at = clock.now()
        if number == 3:
            break
        task = store.tasks.get("poison")
        assert (task.state, task.not_before) == (TaskState.DELAYED, ended_at + wait)
        assert claim_result(store, "poison").verdict.outcome is Outcome.NOT_CLAIMABLE
        clock.advance(wait - 0.01)
        assert store.promoter.promote_due() == 0  # not yet: still DELAYED
        assert store.tasks.get("poison").state is TaskState.DELAYED
        clock.advance(0.01)
        eventually(lambda: _state(store, "poison", TaskState.READY))  # the promoter's loop

    task = store.tasks.get("poison")
    assert (task.state, task.dead_letter_reason, task.attempt) == (
        TaskState.FAILED,
        DeadLetterReason.EXHAUSTED,
        3,
    )
    attempts = store.tasks.attempts("poison")
    assert [a.end for a in attempts] == [AttemptEnd.EXPIRED] * 3
    ops = [e.op for e in _events(store, etcd_client, "poison")]
    assert ops == [
        Op.CREATE,
        *[Op.CLAIM, Op.BACKOFF, Op.PROMOTE] * 2,
        Op.CLAIM,
        Op.DEAD_LETTER,
    ]
    last = _events(store, etcd_client, "poison")[-1]
    assert last.detail == "all 3 attempts used; last error: lease expired"
    assert _dead_letters(store, "default", "exhausted") == 1
    assert claim_result(store, "poison").verdict.outcome is Outcome.NOT_CLAIMABLE


def test_releases_count_against_the_budget(make_store: StoreFactory) -> None:
    store = make_store()
    _create(store, "t", ("max_attempts", 2))
    store.acceptance.release(claim(store, "t"), principal="w1", reason="shutting down")
    assert store.tasks.get("t").state is TaskState.READY  # no backoff: at once
    store.acceptance.release(claim(store, "t"), principal="w1", reason="shutting down")
    task = store.tasks.get("t")
    assert (task.state, task.dead_letter_reason, task.last_error) == (
        TaskState.FAILED,
        DeadLetterReason.EXHAUSTED,
        "released: shutting down",
    )


def test_a_retryable_fail_with_a_delay_is_claimable_only_after_it(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    _create(store, "t")
    fence = claim(store, "t")
    report = FailureReport(retryable=True, code="RateLimited", delay=30.0)
    failed = store.failures.fail(fence, principal="w1", report=report)
    assert (failed.state, failed.next_eligible_at) == (TaskState.DELAYED, clock.now() + 30)
    assert claim_result(store, "t").verdict.outcome is Outcome.NOT_CLAIMABLE
    nothing = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert nothing.verdict.outcome is Outcome.NO_READY_TASK
    clock.advance(30)
    eventually(lambda: _state(store, "t", TaskState.READY))
    taken = store.claims.claim_next("default", principal="w2", epoch=1, ttl=30)
    assert (taken.verdict.outcome, taken.task and taken.task.task_id) == (Outcome.CLAIMED, "t")


def test_a_listed_error_code_is_never_retried(make_store: StoreFactory) -> None:
    store = make_store()
    _create(store, "t", ("non_retryable_errors", ("BadInput",)))
    report = FailureReport(retryable=True, code="BadInput", message="not JSON")
    failed = store.failures.fail(claim(store, "t"), principal="w1", report=report)
    task = store.tasks.get("t")
    assert (failed.state, task.dead_letter_reason, task.last_error) == (
        TaskState.FAILED,
        DeadLetterReason.NON_RETRYABLE,
        "BadInput: not JSON",
    )


def test_a_takeover_waits_for_the_backoff_the_reclaimer_writes(make_store: StoreFactory) -> None:
    store = make_store(reclaim=False)
    _create(store, "t", *BACKOFF)
    claim(store, "t")
    _expire(store, "t")
    refused = claim_result(store, "t", principal="w2")
    assert refused.verdict.outcome is Outcome.NOT_CLAIMABLE
    assert "next attempt in 10 s" in refused.verdict.message
    assert store.tasks.get("t").state is TaskState.CLAIMED  # nothing written by the refusal
    assert store.reclaimer.reclaim("t")
    assert store.tasks.get("t").state is TaskState.DELAYED


def test_two_replicas_promoting_the_same_due_tasks_move_each_once(
    make_store: StoreFactory, clock: ManualClock, etcd_client: Any
) -> None:
    first, second = make_store(reclaim=False), make_store(reclaim=False)  # no promoter loops
    ids = [f"d-{n}" for n in range(12)]
    for task_id in ids:
        _create(first, task_id, not_before=clock.now() + 5)
    assert {first.tasks.get(t).state for t in ids} == {TaskState.DELAYED}
    assert first.promoter.promote_due() == 0
    clock.advance(5)
    barrier, moved = threading.Barrier(2), [0, 0]

    def promote(index: int, store: Store) -> None:
        barrier.wait()
        moved[index] = store.promoter.promote_due()

    threads = [threading.Thread(target=promote, args=(i, s)) for i, s in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(moved) == len(ids)
    for task_id in ids:
        assert first.tasks.get(task_id).state is TaskState.READY
        ops = [e.op for e in _events(first, etcd_client, task_id)]
        assert ops == [Op.CREATE_DELAYED, Op.PROMOTE]
    assert list(etcd_client.get_prefix(first.ctx.keys.delayed_prefix)) == []


def test_a_pass_reads_only_the_due_part_of_the_delayed_index(
    make_store: StoreFactory, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(reclaim=False)  # no loops: passes by hand
    for n in range(NOT_DUE):
        _create(store, f"later-{n}", not_before=clock.now() + 3600)
    for n in range(3):
        _create(store, f"soon-{n}", not_before=clock.now() + 1)
    keys, kv = store.ctx.keys, store.ctx.kv
    read_range = kv.range_page
    returned: list[int] = []  # keys of the delayed index each range read returned

    def spy(start: str, end: str, **options: Any) -> tuple[list[KV], int]:
        found, revision = read_range(start, end, **options)
        if start.startswith(keys.delayed_prefix):
            returned.append(len(found))
        return found, revision

    monkeypatch.setattr(kv, "range_page", spy)
    assert store.promoter.promote_due() == 0
    clock.advance(1)
    assert store.promoter.promote_due() == 3
    assert store.promoter.promote_due() == 0
    # Each pass read only the due keys (none, the three, none), never the NOT_DUE others.
    assert returned == [0, 3, 0]
    assert {store.tasks.get(f"soon-{n}").state for n in range(3)} == {TaskState.READY}
    assert store.tasks.get("later-0").state is TaskState.DELAYED


def test_stalled_and_renew_limited_attempts_count_against_the_budget(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()  # the reclaimer follows the claim keys' expiry
    _create(store, "t", ("max_attempts", 2))
    # Attempt 1 stalls: no new progress marker for longer than stall_timeout. Its renewal is
    # refused and keeps nothing alive, so the lease runs out (etcd's real TTL, ~2 s).
    stalled = claim(store, "t", ttl=1)
    clock.advance(LIMITS.stall_timeout + 1)
    renewed = store.renewals.renew(stalled, principal="w1", progress="")
    assert renewed.verdict.outcome is Outcome.STALLED
    eventually(lambda: _state(store, "t", TaskState.CLAIMED, TaskState.READY) is TaskState.READY)
    assert attempts_counted(store.tasks.get("t")) == 1  # one of the two is used
    # Attempt 2 reaches max_claim_duration: its renewal is refused RENEW_LIMIT, the lease runs
    # out, and the budget is spent.
    limited = claim(store, "t", ttl=1)
    clock.advance(LIMITS.max_claim_duration)
    renewed = store.renewals.renew(limited, principal="w1", progress="step 2")
    assert renewed.verdict.outcome is Outcome.RENEW_LIMIT
    eventually(lambda: _state(store, "t", TaskState.CLAIMED, TaskState.FAILED) is TaskState.FAILED)
    task = store.tasks.get("t")
    assert (task.dead_letter_reason, task.attempt, task.last_error) == (
        DeadLetterReason.EXHAUSTED,
        2,
        "lease expired",
    )
    assert [a.end for a in store.tasks.attempts("t")] == [AttemptEnd.EXPIRED] * 2


def test_a_failure_above_etcds_high_water_mark_lands_without_its_details(store: Store) -> None:
    """Details only add data: above the mark (and past the caller's share) the failure still
    lands, as it must, kept without its details and with its message cut."""
    _create(store, "t")
    fence = claim(store, "t")
    store.ctx.kv.space.observe(SpaceState.HIGH_WATER)
    report = FailureReport(retryable=True, code="E", message="m" * 1000, details=b"d" * 16384)
    failed = store.failures.fail(fence, principal="w1", report=report)
    assert failed.state is TaskState.READY
    (attempt,) = store.tasks.attempts("t")
    assert (attempt.end, attempt.error_code) == (AttemptEnd.FAILED, "E")
    assert (attempt.error_details, attempt.error_message) == (b"", "m" * KEPT_MESSAGE)
    store.ctx.kv.space.observe(SpaceState.CLEAR)
    fence = claim(store, "t")
    store.failures.fail(fence, principal="w1", report=report)
    assert store.tasks.attempts("t")[-1].error_details == b"d" * 16384  # below it, kept whole


def test_an_etcd_outage_logs_one_failed_due_work_pass_per_kind_not_four_a_second(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both passes ran every quarter second and each failure was a warning: about 470 lines a
    replica in a 10 s etcd outage. One line per kind per FAILED_EVERY, the rest counted."""
    promoter = store.promoter
    promoter.close()
    failing = {"promote_due": 0, "time_out_due": 0}

    def fail(name: str) -> Any:
        def work() -> int:
            failing[name] += 1
            raise StoreUnavailable("etcd txn failed: UNAVAILABLE")

        work.__name__ = name
        return work

    monkeypatch.setattr(promoter, "promote_due", fail("promote_due"))
    monkeypatch.setattr(promoter._deadlines, "time_out_due", fail("time_out_due"))
    monkeypatch.setattr(promoter, "_interval", 0.001)
    promoter._stop.clear()
    with capture_logs() as logs:
        thread = threading.Thread(target=promoter._loop)
        thread.start()
        eventually(lambda: min(failing.values()) >= 20, timeout=10)
        promoter._stop.set()
        thread.join()
    lines = [
        (log["work"], log["held_back"]) for log in logs if log["event"] == "due-work pass failed"
    ]
    assert sorted(lines) == [("promote_due", 0), ("time_out_due", 0)]


def test_above_the_high_water_mark_a_task_past_its_allowed_attempts_waits_untouched(
    store: Store,
) -> None:
    """Each retry writes an attempt and its events whatever its calls carry: a worker failing
    an unlimited task as fast as it could grew etcd ~1 MiB/s past the mark. There a task with
    RETRIES_ABOVE_HIGH_WATER attempts is NOT_CLAIMABLE, by id and by ClaimNext, and nothing
    is written; a fresh task is still claimed, and the task again once the guard clears."""
    _create(store, "churned", ("max_attempts", 0), ("initial_backoff", 0.0))
    report = FailureReport(retryable=True, code="E", message="boom")
    for _ in range(RETRIES_ABOVE_HIGH_WATER):
        store.failures.fail(claim(store, "churned"), principal="w1", report=report)
    _create(store, "fresh")
    store.ctx.kv.space.observe(SpaceState.HIGH_WATER)
    before, counted = store.tasks.get("churned"), _retry_refusals()
    refused = claim_result(store, "churned")
    assert refused.verdict.outcome is Outcome.NOT_CLAIMABLE
    assert f"this task has had {RETRIES_ABOVE_HIGH_WATER} attempts" in refused.verdict.message
    assert store.tasks.get("churned").state_version == before.state_version  # nothing written
    picked = store.claims.claim_next("default", principal="w1", epoch=1, ttl=30)
    assert picked.fence is not None and picked.fence.task_id == "fresh", picked.verdict
    assert _retry_refusals() >= counted + 1  # (the guard counts in the process's registry)
    store.ctx.kv.space.observe(SpaceState.CLEAR)
    assert claim_result(store, "churned").verdict.outcome is Outcome.CLAIMED


def _retry_refusals() -> float:
    labels = {"state": "retry"}
    return METRICS.registry.get_sample_value("coordinator_space_refusals_total", labels) or 0
