"""The work queue's metrics, read from the test's own registry (tests/fixtures.py): retries by
how the attempt ended and whether a backoff follows, the backoff wait histogram, a takeover
counted as the reclaimer counts an expiry, dead letters by deadline, long-poll waiters."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.failures import FailureReport
from coordinator.domain.keys import Keyspace
from coordinator.domain.states import Outcome, TaskState
from coordinator.errors import ResourceExhausted
from coordinator.etcd_process import EtcdProcess
from coordinator.metrics import Metrics
from coordinator.store import EtcdKV, Store, TaskSpec
from tests.helpers import InProcessCaller, eventually
from tests.store.support import StoreFactory, claim

QUEUE = "default"


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """One sample of this test's registry (0 when never observed)."""
    return metrics.registry.get_sample_value(name, labels) or 0.0


def retries(metrics: Metrics, end: str, delayed: str) -> float:
    """coordinator_retries_total of QUEUE for one end and delayed label."""
    return sample(metrics, "coordinator_retries_total", queue=QUEUE, end=end, delayed=delayed)


def waits(metrics: Metrics, le: str = "") -> float:
    """The backoff histogram of QUEUE: its count, or one bucket's (``le``)."""
    if le:
        return sample(metrics, "coordinator_retry_backoff_seconds_bucket", queue=QUEUE, le=le)
    return sample(metrics, "coordinator_retry_backoff_seconds_count", queue=QUEUE)


def _create(store: Store, task_id: str, *policy: tuple[str, Any], **fields: Any) -> None:
    spec = TaskSpec(task_id=task_id, input=b"x", retry=tuple(policy), **fields)
    store.tasks.create(spec, by="pm")


def test_retries_are_counted_by_end_with_the_wait_each_one_imposes(
    make_store: StoreFactory, clock: ManualClock, metrics: Metrics
) -> None:
    store = make_store(reclaim=False)
    _create(store, "soon")  # the server's default backoff: 0
    store.acceptance.release(claim(store, "soon"), principal="w1", reason="rebalancing")
    assert (retries(metrics, "released", "false"), waits(metrics, le="0.0")) == (1, 1)

    _create(store, "later", ("initial_backoff", 10.0), ("backoff_multiplier", 3.0))
    store.acceptance.release(claim(store, "later"), principal="w1", reason="rebalancing")
    assert store.tasks.get("later").state is TaskState.DELAYED
    assert retries(metrics, "released", "true") == 1
    clock.advance(10)
    assert store.promoter.promote_due() == 1
    report = FailureReport(retryable=True, code="Flaky")
    assert store.failures.fail(claim(store, "later"), principal="w1", report=report).state is (
        TaskState.DELAYED
    )
    assert retries(metrics, "failed", "true") == 1
    # Waits observed: 0 (at once), 10 (the first backoff), 30 (the second: 10 * 3).
    assert waits(metrics) == 3
    assert sample(metrics, "coordinator_retry_backoff_seconds_sum", queue=QUEUE) == 40
    assert (waits(metrics, le="5.0"), waits(metrics, le="10.0"), waits(metrics, le="30.0")) == (
        1,
        2,
        3,
    )


def test_a_takeover_counts_its_retry_as_the_reclaimer_counts_an_expiry(
    make_store: StoreFactory, metrics: Metrics
) -> None:
    store = make_store(reclaim=False)  # no reclaimer running: the takeover gets there first
    for task_id in ("taken", "reclaimed"):
        _create(store, task_id)
        claim(store, task_id, principal="w1")
        store.ctx.kv.revoke(store.tasks.get(task_id).lease_id)  # as etcd does at expiry
    assert store.tasks.get("taken").state is TaskState.CLAIMED  # its claim key is gone
    claim(store, "taken", principal="w2")
    assert (retries(metrics, "expired", "false"), waits(metrics)) == (1, 1)
    assert store.reclaimer.scan() == 1  # "reclaimed" by the reclaimer's path
    assert store.tasks.get("reclaimed").state is TaskState.READY
    assert (retries(metrics, "expired", "false"), waits(metrics)) == (2, 2)
    # Both ended attempts count as expired attempt ends too, whichever path ended them.
    ends = sample(metrics, "coordinator_attempt_ends_total", queue=QUEUE, end="expired", code="")
    assert ends == 2


def test_a_deadline_passing_counts_a_timed_out_dead_letter(
    make_store: StoreFactory, clock: ManualClock, metrics: Metrics
) -> None:
    store = make_store(reclaim=False)
    _create(store, "held", schedule_to_close=60.0)
    _create(store, "waiting", schedule_to_close=60.0)
    claim(store, "held")
    clock.advance(60)
    assert store.deadlines.time_out_due() == 2
    dead = "coordinator_tasks_dead_lettered_total"
    assert sample(metrics, dead, queue=QUEUE, reason="timed_out") == 2
    assert sample(metrics, dead, queue=QUEUE, reason="exhausted") == 0
    assert retries(metrics, "expired", "false") == 0  # a deadline ends the task, no retry


@pytest.fixture
def capped(etcd: EtcdProcess, prefix: str, metrics: Metrics) -> Iterator[Store]:
    """A store whose replica lets two long polls wait at once, counting on this test's
    metrics."""
    kv = EtcdKV.connect([etcd.endpoint])
    store = Store.open(kv, keys=Keyspace(prefix), max_claim_waiters=2, metrics=metrics)
    store.start()
    try:
        yield store
    finally:
        store.close()
        kv.close()


def test_long_poll_waiters_are_gauged_and_a_refusal_past_the_cap_counted(
    capped: Store, metrics: Metrics
) -> None:
    store, callers = capped, {f"w{n}": InProcessCaller() for n in range(3)}
    callers["w9"] = InProcessCaller()

    def poll(principal: str) -> Outcome:
        result = store.long_poll.claim_next(
            "q", principal=principal, epoch=1, ttl=30, wait=15, caller=callers[principal]
        )
        return result.verdict.outcome

    with ThreadPoolExecutor(max_workers=2) as pool:
        waiting = [pool.submit(poll, f"w{n}") for n in range(2)]
        eventually(lambda: sample(metrics, "coordinator_claim_waiters") == 2)
        with pytest.raises(ResourceExhausted):
            poll("w9")
        refused = "coordinator_streams_refused_total"
        assert sample(metrics, refused, reason="claim_waiters_full") == 1
        store.tasks.create(TaskSpec(task_id="t", queue="q", input=b"x"), by="pm")
        outcomes = {eventually(lambda: next((w for w in waiting if w.done()), None)).result()}
        assert outcomes == {Outcome.CLAIMED}
        eventually(lambda: sample(metrics, "coordinator_claim_waiters") == 1)
        for caller in callers.values():  # the other caller left: its poll ends, and its place
            caller.leave()
        assert sorted(w.result(timeout=20).name for w in waiting) == ["CLAIMED", "NO_READY_TASK"]
    assert sample(metrics, "coordinator_claim_waiters") == 0
    # Only the one that left while it waited was abandoned (the winner had left the line).
    assert sample(metrics, "coordinator_claim_waiters_abandoned_total") == 1
