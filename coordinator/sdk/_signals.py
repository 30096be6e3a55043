"""``stop_on_signals`` for the thread pool: SIGTERM / SIGINT stop a WorkerPool, and a second one
cuts its grace short, never waiting on a lock or on a log line."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from coordinator.sdk._core.pool import HURRIED, REPEATED, STOPPING

log = structlog.get_logger(__name__)


class Stoppable(Protocol):
    """What a signal stops (a WorkerPool)."""

    def stop(self) -> None:
        """Stop; idempotent."""

    def hurry(self) -> None:
        """Stop, and cut the grace short."""


DUPLICATE_WINDOW = 1.0
"""Seconds after the first signal in which another is the same stop delivered twice, not a
second one: GNU ``timeout`` and some supervisors send SIGTERM to the process and then to its
process group, which hurried the pool at once (its grace skipped) in a third of the tries."""


class SignalCount:
    """Which signal this is, as the pools answer it: the first, a repeat of it (within
    DUPLICATE_WINDOW), or a later one. Called from one thread (or the loop) only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: float | None = None

    def hurries(self) -> bool | None:
        """None for the first signal, True for a later one, False for a repeat of the first."""
        now = self._clock()
        if self._first is None:
            self._first = now
            return None
        return now - self._first >= DUPLICATE_WINDOW


def answer_signal(pool: Stoppable, hurries: bool | None, signum: signal.Signals) -> None:
    """Both pools' answer to a signal (``SignalCount.hurries``): the first stops, a later one
    cuts the grace short, a repeat of the first is only logged. Stop first: the log line after
    it must never decide whether the pool stops."""
    if hurries is False:
        log.info(REPEATED, signal=signum.name)
        return
    (pool.hurry if hurries else pool.stop)()
    log.info(HURRIED if hurries else STOPPING, signal=signum.name)


def stop_on_signals(
    pool: Stoppable, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> Callable[[], None]:
    """Make ``signals`` stop ``pool``; returns a function restoring the previous handlers.
    Call it from the main thread (Python runs signal handlers there only).

    The handler only writes the signal number to a pipe: it runs between two bytecodes of the
    main thread, which may be holding one of the pool's locks at that moment, so it must take
    none. A thread reading the pipe calls ``stop()``.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def on_signal(signum: int, frame: object) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe already holds a wake-up
            os.write(write_fd, bytes([signum]))

    def watch() -> None:
        count = SignalCount()
        while data := os.read(read_fd, 16):
            for signum in data:
                answer_signal(pool, count.hurries(), signal.Signals(signum))
        os.close(read_fd)

    previous = {signum: signal.signal(signum, on_signal) for signum in signals}
    threading.Thread(target=watch, name="pool-signals", daemon=True).start()

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(write_fd)  # the watcher reads end-of-file and ends

    return restore
