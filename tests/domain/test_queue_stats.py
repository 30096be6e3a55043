"""Which queues the autoscaling figures report, in which order, and their ages."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.queue_stats import QueueStats, ReadyHead, queue_report


def test_only_queues_with_work_are_reported_busiest_first_then_by_name() -> None:
    ready = {"a": ReadyHead(2, 90.0), "b": ReadyHead(0, 0.0), "c": ReadyHead(1, 99.5)}
    claimed = {"c": 1, "d": 3, "e": 0}
    report = queue_report(ready, claimed, 100.0)
    assert report.queues == (
        QueueStats("d", ready=0, oldest_ready_age=0.0, claimed=3),
        QueueStats("a", ready=2, oldest_ready_age=10.0, claimed=0),
        QueueStats("c", ready=1, oldest_ready_age=0.5, claimed=1),
    )
    assert report.left_out == 0


def test_the_cap_keeps_the_busiest_and_counts_the_rest() -> None:
    ready = {f"q{i}": ReadyHead(i, 0.0) for i in range(1, 6)}
    report = queue_report(ready, {"q1": 10}, 1.0, cap=2)
    assert [s.queue for s in report.queues] == ["q1", "q5"]
    assert report.left_out == 3


def test_an_age_from_a_clock_ahead_of_ours_is_zero_not_negative() -> None:
    (stats,) = queue_report({"q": ReadyHead(1, 105.0)}, {}, 100.0).queues
    assert stats.oldest_ready_age == 0.0


_QUEUES = st.sampled_from(["a", "b", "c", "d", "e", "f"])


@given(
    st.dictionaries(_QUEUES, st.integers(0, 5)),
    st.dictionaries(_QUEUES, st.integers(0, 5)),
    st.integers(0, 7),
)
def test_every_queue_with_work_is_reported_or_counted_left_out(
    ready_counts: dict[str, int], claimed: dict[str, int], cap: int
) -> None:
    ready = {q: ReadyHead(n, 50.0) for q, n in ready_counts.items()}
    report = queue_report(ready, claimed, 60.0, cap=cap)
    busy = {
        q for q in ready_counts.keys() | claimed.keys() if ready_counts.get(q) or claimed.get(q)
    }
    assert len(report.queues) == min(cap, len(busy))
    assert len(report.queues) + report.left_out == len(busy)
    loads = [s.ready + s.claimed for s in report.queues]
    assert loads == sorted(loads, reverse=True)
    for s in report.queues:
        assert (s.ready, s.claimed) == (ready_counts.get(s.queue, 0), claimed.get(s.queue, 0))
        assert s.oldest_ready_age == (10.0 if s.ready else 0.0)
