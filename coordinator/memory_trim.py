"""Handing freed heap back to the OS once a burst of work that needed it has ended.

CPython gives a pymalloc arena back only once every object in it is gone, and glibc's malloc
keeps what is freed in its heaps (the main one and one per thread that allocated) for the next
allocation, returning only a free top of the main heap. So a replica that answered 32 whole-log
replays at once (issue 25) still held the +26 MiB of RSS they took once they had ended, though
nothing referenced it any more. ``malloc_trim(0)`` asks glibc to return every free page of
every heap; only glibc has it, so ``trim_heap`` elsewhere only collects garbage.

``QuietTrim`` runs it once per quiet period, off every handler's path: ``quiet()`` (the last
unit of work ended) arms a timer of ``delay`` seconds on a daemon thread of its own, ``busy()``
(work started again) disarms it, so a burst of replays is trimmed once, after its last.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from collections.abc import Callable
from functools import cache

import structlog

log = structlog.get_logger(__name__)

QUIET_SECONDS = 1.0
"""How long the work stays ended before the heap is trimmed: a burst's next unit, arriving
within it, is not slowed by a trim in between."""


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library is not glibc (musl, macOS)."""
    try:
        os.confstr("CS_GNU_LIBC_VERSION")  # only glibc defines the name
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, ValueError, OSError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def rss_bytes() -> int:
    """This process's resident set now (0 where there is no ``/proc``)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def trim_heap() -> int:
    """Collect cyclic garbage, then hand every free page of the heap back to the OS (glibc
    only; elsewhere the collection alone). Returns the bytes of RSS that went (0: none, or
    unknown)."""
    before = rss_bytes()
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    return max(0, before - rss_bytes())


class QuietTrim:
    """Trims the heap once, ``delay`` seconds after the work it watches went quiet."""

    def __init__(
        self, work: str, *, delay: float = QUIET_SECONDS, trim: Callable[[], int] = trim_heap
    ) -> None:
        self._work = work
        self._delay = delay
        self._trim = trim
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._trims = 0

    @property
    def trims(self) -> int:
        """Trims run so far."""
        with self._lock:
            return self._trims

    def quiet(self) -> None:
        """The last unit of work ended: trim in ``delay`` seconds, unless work starts again."""
        with self._lock:
            self._disarm()
            self._timer = threading.Timer(self._delay, self._fire)
            self._timer.name = f"trim after {self._work}"
            self._timer.daemon = True
            self._timer.start()

    def busy(self) -> None:
        """Work started again: no trim until it is next quiet."""
        with self._lock:
            self._disarm()

    def close(self) -> None:
        """Drop a trim still waiting (the owner is shutting down)."""
        self.busy()

    def _fire(self) -> None:
        with self._lock:
            if self._timer is not threading.current_thread():
                return  # disarmed as it fired: work started again
            self._timer = None
        returned = self._trim()
        with self._lock:
            self._trims += 1
        log.info("heap trimmed", after=self._work, returned_bytes=returned, rss_bytes=rss_bytes())

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
