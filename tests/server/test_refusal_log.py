"""Which refused calls get a log line: one per principal per interval, memory bounded
(coordinator.server.refusal_log). Pure: the clock is driven by the test."""

from __future__ import annotations

from coordinator.server.refusal_log import RefusalLog


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_principal_per_interval_then_the_count_left_out() -> None:
    clock = Clock()
    refusals = RefusalLog(interval=10.0, monotonic=clock)
    assert [refusals.due("pool") for _ in range(5)] == [0, None, None, None, None]
    assert refusals.due("other") == 0  # another principal has its own line
    clock.now += 9.9
    assert refusals.due("pool") is None
    clock.now += 0.1
    assert refusals.due("pool") == 5  # the four after its line, and the one at 9.9 s
    assert refusals.due("pool") is None
    clock.now += 10.0
    assert refusals.due("pool") == 1


def test_principals_past_the_bound_share_one_entry_and_expired_ones_make_room() -> None:
    clock = Clock()
    refusals = RefusalLog(interval=10.0, max_principals=3, monotonic=clock)
    assert [refusals.due(f"p-{n}") for n in range(3)] == [0, 0, 0]
    # Three fresh entries: any new principal shares the overflow entry, one line per interval.
    assert [refusals.due(f"q-{n}") for n in range(50)] == [0] + [None] * 49
    assert refusals.tracked() == 3
    assert refusals.due("p-0") is None  # a tracked principal keeps its own entry
    clock.now += 10.0
    # p-0's entry expired (its line is 10 s old): a new principal takes its place...
    assert refusals.due("r-0") == 0
    assert refusals.tracked() == 3
    assert [refusals.due("p-1"), refusals.due("p-2")] == [0, 0]  # lines again: fresh
    # Every entry fresh: the next new principal is the overflow's, whose line is due again and
    # says how many it left out.
    assert refusals.due("s-0") == 49
    assert refusals.due("s-1") is None
    assert refusals.tracked() == 3
