"""The log throttle: one line per interval, and the count of the lines held back in between."""

from __future__ import annotations

import pytest

from coordinator.logging import Throttle


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_interval_and_the_next_carries_the_held_back_count() -> None:
    clock = Clock()
    throttle = Throttle(5.0, monotonic=clock)
    assert throttle.admit() == 0
    clock.now += 4.9
    assert [throttle.admit() for _ in range(3)] == [None, None, None]
    clock.now += 0.1  # 5.0 after the last admitted line
    assert throttle.admit() == 3
    assert throttle.admit() is None
    clock.now += 60
    assert throttle.admit() == 1
    assert throttle.admit() is None


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_no_interval_admits_every_line(interval: float) -> None:
    throttle = Throttle(interval, monotonic=Clock())
    assert [throttle.admit() for _ in range(3)] == [0, 0, 0]
