"""The defaults that forgive a bad deploy, on a real etcd with a manual clock: the server's
default backoff spreads a failing handler's attempts, the attempt-end metric says which code a
queue fails with, and RetryTasks sends a queue's dead letters back a bounded page at a time."""

from __future__ import annotations

import itertools

from prometheus_client import CollectorRegistry

from coordinator.clock import ManualClock
from coordinator.domain.bulk_retry import DeadLetterFilter
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import DeadLetterReason, TaskState
from coordinator.metric_families import (
    MAX_CODES_PER_QUEUE,
    MAX_LABELLED_QUEUES,
    OTHER_CODE,
    OTHER_QUEUE,
)
from coordinator.metrics import Metrics
from coordinator.store import Store, TaskSpec
from tests.helpers import RETRY_AT_ONCE, eventually
from tests.store.support import StoreFactory, claim

BUG = FailureReport(retryable=True, code="KeyError", message="'customer'")


def _fail_until_dead(store: Store, clock: ManualClock, task_id: str) -> list[float]:
    """A handler that fails the instant it gets the task, every time, with the clock moved
    only as far as each backoff demands; returns when each attempt started."""
    starts: list[float] = []
    while True:
        starts.append(clock.now())
        failed = store.failures.fail(claim(store, task_id), principal="w1", report=BUG)
        if failed.state is TaskState.FAILED:
            return starts
        assert failed.state is TaskState.DELAYED
        clock.advance(
            failed.next_eligible_at - clock.now() + 0.002
        )  # the delayed index counts in ms
        eventually(lambda: store.tasks.get(task_id).state is TaskState.READY)


def test_the_default_policy_spreads_a_failing_handlers_attempts_over_15_s_and_more(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store(limits=ClaimLimits(min_ttl=1, max_ttl=30))  # the server's defaults
    for task_id in ("order-1", "order-2"):
        store.tasks.create(TaskSpec(task_id=task_id, queue="orders", input=b"x"), by="pm")
    starts = {t: _fail_until_dead(store, clock, t) for t in ("order-1", "order-2")}
    for task_id, at in starts.items():
        task = store.tasks.get(task_id)
        assert (task.dead_letter_reason, task.attempt) == (DeadLetterReason.EXHAUSTED, 5)
        gaps = [b - a for a, b in itertools.pairwise(at)]
        assert len(gaps) == 4
        for gap, base in zip(gaps, (1, 2, 4, 8), strict=True):
            assert base <= gap < base * 1.2, (task_id, gaps)
        assert at[-1] - at[0] >= 15.0
    # Jitter: the two tasks that failed alike did not come back at the same instants.
    first, second = starts.values()
    assert [b - a for a, b in itertools.pairwise(first)] != [
        b - a for a, b in itertools.pairwise(second)
    ]


def test_attempt_ends_are_counted_by_queue_end_and_code_with_codes_bounded_per_queue(
    make_store: StoreFactory,
) -> None:
    store = make_store(limits=ClaimLimits(min_ttl=1, max_ttl=30, retry=RETRY_AT_ONCE))
    store.tasks.create(TaskSpec(task_id="t", queue="orders", input=b"x"), by="pm")
    store.failures.fail(claim(store, "t"), principal="w1", report=BUG)
    store.acceptance.release(claim(store, "t"), principal="w1", reason="draining")
    registry = store.ctx.metrics.registry

    def ends(end: str, code: str = "") -> float:
        labels = {"queue": "orders", "end": end, "code": code}
        return registry.get_sample_value("coordinator_attempt_ends_total", labels) or 0

    assert (ends("failed", "KeyError"), ends("released")) == (1, 1)
    metrics = store.ctx.metrics
    for n in range(MAX_CODES_PER_QUEUE + 5):
        metrics.count_attempt_end("orders", "failed", f"Code{n}")
    # KeyError took one of the queue's slots: the last 6 new codes fold into "other".
    assert ends("failed", OTHER_CODE) == 6
    assert ends("failed", f"Code{MAX_CODES_PER_QUEUE - 2}") == 1
    assert ends("failed", f"Code{MAX_CODES_PER_QUEUE - 1}") == 0
    metrics.count_attempt_end("other-queue", "failed", "Code99")  # a bound per queue
    labels = {"queue": "other-queue", "end": "failed", "code": "Code99"}
    assert registry.get_sample_value("coordinator_attempt_ends_total", labels) == 1


def _dead_letter(store: Store, task_id: str, report: FailureReport, queue: str = "orders") -> None:
    spec = TaskSpec(task_id=task_id, queue=queue, input=b"x", retry=(("max_attempts", 1),))
    store.tasks.create(spec, by="pm")
    failed = store.failures.fail(claim(store, task_id), principal="w1", report=report)
    assert failed.state is TaskState.FAILED


def test_retry_many_picks_by_code_and_time_pages_by_limit_and_skips_what_it_retried(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    for n in range(5):
        _dead_letter(store, f"t{n}", BUG)
    _dead_letter(store, "other-code", FailureReport(retryable=True, code="Timeout"))
    _dead_letter(store, "other-queue", BUG, queue="emails")
    clock.advance(60)
    _dead_letter(store, "t5-late", BUG)
    bugs = DeadLetterFilter("orders", error_code="KeyError")

    preview = store.dead_letters.retry_many(bugs, limit=100, dry_run=True, by="admin", reason="")
    assert preview.retried == ("t0", "t1", "t2", "t3", "t4", "t5-late")
    assert store.tasks.get("t0").state is TaskState.FAILED  # a dry run writes nothing

    late = DeadLetterFilter("orders", error_code="KeyError", failed_since=clock.now())
    only = store.dead_letters.retry_many(late, limit=100, dry_run=True, by="admin", reason="")
    assert only.retried == ("t5-late",)

    first = store.dead_letters.retry_many(bugs, limit=2, by="admin", reason="fixed in 1.4.2")
    assert (first.retried, first.next_page_token) == (("t0", "t1"), "t1")
    rest = store.dead_letters.retry_many(
        bugs, limit=100, page_token=first.next_page_token, by="admin", reason="fixed in 1.4.2"
    )
    assert (rest.retried, rest.skipped, rest.next_page_token) == (
        ("t2", "t3", "t4", "t5-late"),
        (),
        "",
    )
    # Re-running from the start finds nothing: every one it retried is READY now.
    again = store.dead_letters.retry_many(bugs, limit=100, by="admin", reason="again")
    assert (again.retried, again.skipped) == ((), ())
    for task_id in ("t0", "t4", "t5-late"):
        task = store.tasks.get(task_id)
        assert (task.state, task.attempts_base) == (TaskState.READY, 1)
    for task_id in ("other-code", "other-queue"):
        assert store.tasks.get(task_id).state is TaskState.FAILED


def test_retry_many_skips_a_task_it_cannot_retry_and_goes_on(
    make_store: StoreFactory, clock: ManualClock
) -> None:
    store = make_store()
    spec = TaskSpec(task_id="a-late", queue="orders", input=b"x", schedule_to_close=10.0)
    store.tasks.create(spec, by="pm")
    _dead_letter(store, "b-ok", BUG)
    clock.advance(11)
    store.deadlines.time_out_due()
    assert store.tasks.get("a-late").dead_letter_reason is DeadLetterReason.TIMED_OUT
    page = store.dead_letters.retry_many(
        DeadLetterFilter("orders"), limit=100, by="admin", reason="fixed"
    )
    assert page.retried == ("b-ok",)
    [skipped] = page.skipped
    assert skipped.task_id == "a-late" and "new schedule_to_close" in skipped.reason
    assert store.tasks.get("a-late").state is TaskState.FAILED


def test_the_queue_labelled_counters_name_a_bounded_number_of_queues() -> None:
    """A token creating each task in a new queue made four series per queue, for as long as the
    replica ran: 8,220 queues, 33,000 lines a scrape. Past the bound, queues count as one."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for n in range(MAX_LABELLED_QUEUES + 3):
        metrics.count_dead_letter(f"q{n}", "MAX_ATTEMPTS")
        metrics.count_attempt_end(f"q{n}", "failed", "E")
    metrics.count_dead_letter("q0", "MAX_ATTEMPTS")  # a queue named before stays named

    def dead(queue: str) -> float | None:
        labels = {"queue": queue, "reason": "MAX_ATTEMPTS"}
        return registry.get_sample_value("coordinator_tasks_dead_lettered_total", labels)

    assert (dead("q0"), dead(f"q{MAX_LABELLED_QUEUES - 1}"), dead(OTHER_QUEUE)) == (2, 1, 3)
    assert dead(f"q{MAX_LABELLED_QUEUES}") is None
    ends = {"queue": OTHER_QUEUE, "end": "failed", "code": "E"}
    assert registry.get_sample_value("coordinator_attempt_ends_total", ends) == 3
