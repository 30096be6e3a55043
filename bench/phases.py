"""The run's phases against its time bound, and the load average around each of them.

A full run has a wall-time budget (``--budget``). Before a phase starts, ``fits`` skips it if
its expected length would pass the bound. A phase can still run long on a busy machine (the
bench once ran past its 15-minute bound and was killed from outside, leaving nothing to read,
issue 27), so the bound is also enforced while a phase runs: ``armed`` raises ``OverBudget`` in
the main thread when the bound passes. The phase in flight is then cut off (its figures are
dropped, the reason recorded), the ``with`` blocks that own etcd and the servers unwind and stop
them, and the report is written with what ran before. Stopping them takes a few seconds past
the bound (a SIGTERM, then a SIGKILL after 10 s at most).

``OverBudget`` is a BaseException, like KeyboardInterrupt: the phases' own ``except Exception``
(a failed compaction, say) must not swallow it.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from collections.abc import Iterator
from types import FrameType

from bench.harness import say
from bench.machine import load_average


class OverBudget(BaseException):
    """The run's time bound passed while a phase ran."""


class PhaseClock:
    """Which phases ran, which were skipped or cut off and why, and the machine's load average
    before and after each one that started."""

    def __init__(self, budget: float | None, started: float) -> None:
        """``budget`` seconds from ``started`` (``time.monotonic()``); None: no bound."""
        self.budget = budget
        self.deadline = started + budget if budget is not None else math.inf
        self.skipped: dict[str, str] = {}
        # phase -> {"before": [1, 5, 15 min], "after": [...]}
        self.load: dict[str, dict[str, list[float]]] = {}
        self.cut_off = False
        self._armed = False

    def fits(self, phase: str, need: float) -> bool:
        """Whether ``phase``, expected to take ``need`` seconds, ends before the bound; if not
        it is recorded as skipped."""
        if time.monotonic() + need <= self.deadline:
            return True
        self.skipped[phase] = f"the {self.budget:g} s budget was used up"
        return False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Run one phase: the load average is read before and after it (also when it fails or
        is cut off at the bound)."""
        before = load_average()
        try:
            yield
        except OverBudget:
            self.skipped[name] = f"cut off: the {self.budget:g} s budget ran out during it"
            raise
        finally:
            self.load[name] = {"before": before, "after": load_average()}

    def not_reached(self, phases: list[str], ran: set[str]) -> None:
        """After a cut-off: each chosen phase that neither ran nor has a reason is skipped."""
        for name in phases:
            if name not in ran and name not in self.skipped:
                self.skipped[name] = f"the {self.budget:g} s budget was used up"

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """Raise OverBudget in this thread (it must be the main thread: signals are delivered
        there) once the bound passes; once only, and never after the block is left. Swallows
        the OverBudget it raised: ``cut_off`` says it happened.

        SIGALRM may be someone else's too (pytest-timeout's, in a test): their handler and
        their timer are put back when the block is left, the timer with what it had left (it
        rings at once if it came due meanwhile: late, never lost)."""
        if self.budget is None:
            yield
            return
        outer, _ = signal.getitimer(signal.ITIMER_REAL)
        outer_due = time.monotonic() + outer
        previous = signal.signal(signal.SIGALRM, self._ring)
        self._armed = True
        signal.setitimer(signal.ITIMER_REAL, max(self.deadline - time.monotonic(), 0.001))
        try:
            try:
                yield
            finally:
                # A ring before this line is still caught below; after it, it does nothing.
                self._armed = False
        except OverBudget:
            say(f"the {self.budget:g} s budget ran out: stopping, reporting what ran")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            if outer:
                signal.setitimer(signal.ITIMER_REAL, max(outer_due - time.monotonic(), 0.001))

    def _ring(self, signum: int, frame: FrameType | None) -> None:
        if self._armed:  # a ring late for a block already left is ignored
            self._armed = False
            self.cut_off = True
            raise OverBudget
