"""Logging: structlog JSON lines on stderr, one event per line, level configurable.

Worker calls bind ``task_id``, ``attempt``, ``generation`` and ``epoch`` with ``bound(...)`` so
that every line logged during the call (ours and the store's) carries them, and so does the one
line the call-log interceptor writes when the call ends (coordinator.server.call_log); ``note``
adds a field to that line only. Records from the
standard library (grpc, etcd3) go through the same renderer, so stderr is JSON throughout.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import structlog

LEVELS = ("debug", "info", "warning", "error", "critical")
"""The accepted ``--log-level`` values, lowest first."""

_SHARED: list[structlog.typing.Processor] = [
    structlog.contextvars.merge_contextvars,
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def configure_logging(level: str = "info") -> None:
    """Send structlog and stdlib logging to stderr as JSON lines at ``level`` and above."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    threshold = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        # Not cached: a later configure_logging (tests, `coordinator up`) must take effect on
        # module-level loggers that were already used.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
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
