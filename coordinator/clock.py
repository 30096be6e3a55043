"""An injectable clock: the store takes time from here, never from a worker."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds since the epoch, as a float."""

    def now(self) -> float:
        """Current time in seconds."""
        ...


class SystemClock:
    """The coordinator replica's own wall clock."""

    def now(self) -> float:
        """Current time in seconds."""
        return time.time()


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        """Current (manual) time in seconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self._now += seconds
