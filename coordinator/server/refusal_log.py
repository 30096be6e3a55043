"""Log lines for refused calls, at most one per principal per interval.

A pool of hundreds of agents sharing one token long-polls ClaimNext: past its share each poll
is refused RESOURCE_EXHAUSTED at once and retried, ~150 refusals a second on one replica, each a
~450-byte log line (~6 GB a day). The refusals are counted in metrics either way; the log only
needs to say that a principal is being refused, how often, and why. So the call log asks
``RefusalLog.due`` before writing a refused call's line: the first refusal of a principal is
logged, the next ones within ``interval`` seconds are only counted, and the next line carries
how many were left out (``refusals_not_logged``).

Memory is bounded: at most ``max_principals`` principals are tracked; an entry whose interval
has passed is dropped to make room, and past that every untracked principal shares one entry
(``OVERFLOW``), so a flood of many principals costs one line per interval, not one each.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

OVERFLOW = "*"
"""The entry principals share when ``max_principals`` fresh entries are tracked already."""


class RefusalLog:
    """Decides which refused calls get a log line: one per principal per ``interval``."""

    def __init__(
        self,
        *,
        interval: float = 10.0,
        max_principals: int = 4096,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self._max = max_principals
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # principal -> (when its last line was written, refusals not logged since); oldest
        # line first, so the entries due to expire are at the front.
        self._entries: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._overflow: tuple[float, int] | None = None

    def due(self, principal: str) -> int | None:
        """None: leave this refusal out of the log (it is counted). Otherwise write its line now,
        saying how many refusals of the same entry were left out since the previous one."""
        now = self._monotonic()
        with self._lock:
            key = principal if self._make_room(principal, now) else OVERFLOW
            entry = self._overflow if key == OVERFLOW else self._entries.get(key)
            if entry is not None and now - entry[0] < self.interval:
                self._put(key, (entry[0], entry[1] + 1))
                return None
            self._put(key, (now, 0))
            return entry[1] if entry is not None else 0

    def tracked(self) -> int:
        """Principals with an entry now (at most ``max_principals``)."""
        with self._lock:
            return len(self._entries)

    def _put(self, key: str, entry: tuple[float, int]) -> None:
        if key == OVERFLOW:
            self._overflow = entry
            return
        self._entries[key] = entry
        if entry[1] == 0:
            self._entries.move_to_end(key)  # a line written now: the newest entry

    def _make_room(self, principal: str, now: float) -> bool:
        """Whether ``principal`` has (or now got room for) an entry of its own; entries whose
        interval passed are dropped, oldest first, to make it."""
        if principal in self._entries:
            return True
        while len(self._entries) >= self._max:
            oldest, (logged_at, _) = next(iter(self._entries.items()))
            if now - logged_at < self.interval:
                return False
            # What it left out since its last line goes unsaid: its next line comes a full
            # interval late anyway, and the metrics have the count.
            del self._entries[oldest]
        return True
