"""``stop_on_signals`` for the thread pool: SIGTERM / SIGINT stop a WorkerPool, and a second one
cuts its grace short, never waiting on a lock or on a log line."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from coordinator.sdk._core.pool import HURRIED, STOPPING

log = structlog.get_logger(__name__)


class Stoppable(Protocol):
    """What a signal stops (a WorkerPool)."""

    def stop(self) -> None:
        """Stop; idempotent."""

    def hurry(self) -> None:
        """Stop, and cut the grace short."""


def answer_signal(pool: Stoppable, seen: int, signum: signal.Signals) -> None:
    """Both pools' answer to the ``seen``-th signal (counted from one): stop, and from the
    second on cut the grace short. Stop first: the log line after it must never decide whether
    the pool stops."""
    (pool.hurry if seen > 1 else pool.stop)()
    log.info(HURRIED if seen > 1 else STOPPING, signal=signum.name)


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
        seen = 0
        while data := os.read(read_fd, 16):
            for signum in data:
                seen += 1
                answer_signal(pool, seen, signal.Signals(signum))
        os.close(read_fd)

    previous = {signum: signal.signal(signum, on_signal) for signum in signals}
    threading.Thread(target=watch, name="pool-signals", daemon=True).start()

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        os.close(write_fd)  # the watcher reads end-of-file and ends

    return restore
