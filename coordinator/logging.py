"""Logging: structlog JSON lines on stderr, one event per line, level configurable.

Worker calls bind ``task_id``, ``attempt``, ``generation`` and ``epoch`` with ``bound(...)`` so
that every line logged during the call (ours and the store's) carries them, and so does the one
line the call-log interceptor writes when the call ends
(coordinator.server.interceptors.call_log); ``note`` adds a field to that line only. Records from
the standard library (grpc, etcd3) go through the same renderer, so stderr is JSON throughout.

Every line goes through one ``SafeStream``: a log write that fails (a closed pipe, a full disk)
is counted as lost, never raised, because the code that logs includes the signal path
and the shutdown of a worker, which must not die or wedge on a dead log pipe.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TextIO, cast

import structlog

LEVELS = ("debug", "info", "warning", "error", "critical")
"""The accepted ``--log-level`` values, lowest first."""

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


class SafeStream:
    """A text stream whose write errors are swallowed and counted, never raised.

    A worker's stderr may be a pipe whose reader died or a file on a full disk: a log line
    that raises there would kill whichever thread logged it, the thread that turns SIGTERM
    into a shutdown included (issue 29: a worker deaf to SIGTERM, renewing its claims until
    ``kill -9``). Each later write is still tried (a disk may get space back); the first one
    that gets through is preceded by a line saying how many were lost.
    """

    def __init__(self, stream: TextIO) -> None:
        """Wrap ``stream`` (stderr, as it is when logging is configured)."""
        self._stream = stream
        self._lock = threading.Lock()
        self._lost = 0
        self._unreported = 0

    @property
    def lost(self) -> int:
        """Lines lost to write errors since this stream was made."""
        with self._lock:
            return self._lost

    def write(self, text: str) -> int:
        """Write ``text`` and flush it (each log line is one call); len(text) even if lost."""
        with self._lock:
            if self._unreported and self._put(_lost_line(self._unreported)):
                self._unreported = 0
            if not self._put(text):
                self._lost += 1
                self._unreported += 1
        return len(text)

    def flush(self) -> None:
        """Nothing to do: every write flushed already."""

    def _put(self, text: str) -> bool:
        # A failed flush may leave the text in the stream's buffer (bounded by its size): it
        # comes out later if the stream recovers, though it was counted as lost.
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # EPIPE, ENOSPC, EIO; ValueError: the stream was closed
            return False
        return True


def _lost_line(count: int) -> str:
    """The JSON line that reports ``count`` log lines lost to write errors."""
    return (
        json.dumps({"event": "log lines lost: stderr could not be written", "lost": count}) + "\n"
    )


def configure_logging(level: str = "info") -> None:
    """Send structlog and stdlib logging to stderr as JSON lines at ``level`` and above (through
    one SafeStream: a log write never raises)."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    threshold = logging.getLevelNamesMapping()[level.upper()]
    stream = SafeStream(sys.stderr)
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        # WriteLogger calls only write() and flush(), the two methods SafeStream has.
        logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, stream)),
        # Not cached: a later configure_logging (tests, `coordinator up`) must take effect on
        # module-level loggers that were already used.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[*_SHARED, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(threshold)


CALL_FIELDS: ContextVar[dict[str, Any] | None] = ContextVar("coordinator_call_fields", default=None)
"""The fields of the current call's one log line: set by the call-log interceptor in the call's
own context, filled by ``bound`` and ``note``; None outside a call."""


def note(**fields: Any) -> None:
    """Add ``fields`` to the current call's one log line (nothing outside a call)."""
    collected = CALL_FIELDS.get()
    if collected is not None:
        collected.update(fields)


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Bind ``fields`` to every log line of the current call (thread- and context-local) and
    to the call's own line."""
    note(**fields)
    with structlog.contextvars.bound_contextvars(**fields):
        yield


class Throttle:
    """Admits at most one log line per ``interval`` seconds and counts the lines it held back.

    For lines any caller can cause at will (a flood of malformed requests): the first one is
    logged, later ones within the interval are only counted, and the next admitted line carries
    the count, so nothing disappears without a trace and the log stays bounded.
    """

    def __init__(self, interval: float, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        """``monotonic`` is the clock (injected by tests)."""
        self._interval = interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last: float | None = None
        self._held_back = 0

    def admit(self) -> int | None:
        """None if this line is to be dropped; else how many were dropped since the last one."""
        with self._lock:
            now = self._monotonic()
            if self._last is not None and now - self._last < self._interval:
                self._held_back += 1
                return None
            self._last = now
            held_back, self._held_back = self._held_back, 0
            return held_back
