"""The log throttle: one line per interval, and the count of the lines held back in between;
the log stream that never raises: a failed write is counted, and reported once writes work."""

from __future__ import annotations

import errno
import io
import json

import pytest

from coordinator.logging import SafeStream, Throttle


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


class Flaky(io.StringIO):
    """A stream whose writes fail with ``error`` while it is set (EPIPE, ENOSPC, closed)."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = None

    def write(self, text: str) -> int:
        if self.error is not None:
            raise self.error
        return super().write(text)


@pytest.mark.parametrize(
    "error",
    [
        BrokenPipeError(errno.EPIPE, "Broken pipe"),
        OSError(errno.ENOSPC, "No space left on device"),
        ValueError("I/O operation on closed file."),
    ],
)
def test_a_failed_write_is_counted_never_raised_and_reported_once_writes_work(
    error: Exception,
) -> None:
    target = Flaky()
    stream = SafeStream(target)
    stream.write('{"event": "first"}\n')
    target.error = error
    assert [stream.write(f"line {i}\n") for i in range(3)] == [7, 7, 7]
    assert stream.lost == 3
    target.error = None
    stream.write('{"event": "after"}\n')
    lines = target.getvalue().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"event": "first"},
        {"event": "log lines lost: stderr could not be written", "lost": 3},
        {"event": "after"},
    ]
    stream.write('{"event": "later"}\n')  # reported once only
    assert target.getvalue().splitlines()[3:] == ['{"event": "later"}']
    assert stream.lost == 3
