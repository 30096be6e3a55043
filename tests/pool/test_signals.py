"""coordinator.sdk._signals: both pools' answer to SIGTERM / SIGINT. The first stops the pool,
a later one cuts its grace short, and one within DUPLICATE_WINDOW of the first is the same stop
delivered twice (GNU ``timeout`` signals the process, then its group): it hurried the pool, its
grace skipped, in a third of the tries."""

from __future__ import annotations

import signal

from structlog.testing import capture_logs

from coordinator.clock import ManualClock
from coordinator.sdk._core.pool import HURRIED, REPEATED, STOPPING
from coordinator.sdk._signals import DUPLICATE_WINDOW, SignalCount, answer_signal
from tests.pool.support import RecordedPool


def test_a_repeat_of_the_first_signal_keeps_the_grace_and_a_later_one_hurries() -> None:
    clock, pool = ManualClock(), RecordedPool()
    count = SignalCount(clock=clock.now)
    with capture_logs() as logs:
        answer_signal(pool, count.hurries(), signal.SIGTERM)
        clock.advance(0.001)  # the same SIGTERM again, to the process group
        answer_signal(pool, count.hurries(), signal.SIGTERM)
        clock.advance(DUPLICATE_WINDOW)
        answer_signal(pool, count.hurries(), signal.SIGINT)  # a person's Ctrl-C, later
        answer_signal(pool, count.hurries(), signal.SIGINT)
    assert pool.calls == ["stop", "hurry", "hurry"]
    assert [(e["event"], e["signal"]) for e in logs] == [
        (STOPPING, "SIGTERM"),
        (REPEATED, "SIGTERM"),
        (HURRIED, "SIGINT"),
        (HURRIED, "SIGINT"),
    ]
