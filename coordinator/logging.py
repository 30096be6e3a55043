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
from typing import Any, TextIO

import orjson
import structlog
from structlog.typing import EventDict

LEVELS = ("debug", "info", "warning", "error", "critical")
"""The accepted ``--log-level`` values, lowest first."""

# Methods whose level is named otherwise (structlog.processors.add_log_level's rule).
_LEVEL_NAMES = {"warn": "warning", "exception": "error"}
_stack_renderer = structlog.processors.StackInfoRenderer()


def _level_and_time(_logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    """``level`` and an ISO ``timestamp`` in UTC, as structlog's add_log_level and
    TimeStamper(fmt="iso", utc=True) wrote them, in one step. A log line per call was 5-8% of
    the server's CPU (issue 27): each processor is a call, and datetime.isoformat() was the
    priciest of them."""
    event_dict["level"] = _LEVEL_NAMES.get(method_name, method_name)
    event_dict["timestamp"] = _iso_utc(time.time())
    return event_dict


def _stack_and_exception(logger: Any, method_name: str, event_dict: EventDict) -> EventDict:
    """structlog's StackInfoRenderer and format_exc_info, called only for the rare line that
    asks for a stack or carries an exception."""
    if "stack_info" in event_dict or "exc_info" in event_dict:
        event_dict = _stack_renderer(logger, method_name, event_dict)
        return structlog.processors.format_exc_info(logger, method_name, event_dict)
    return event_dict


class _Second(threading.local):
    """The last whole second formatted, per thread: most lines share their second."""

    second = -1
    text = ""


_second = _Second()


def _iso_utc(now: float) -> str:
    """``2026-12-02T08:00:00.123456Z`` (no fraction when it is 0), as datetime.isoformat()."""
    whole = int(now)
    if whole != _second.second:
        _second.text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second.second = whole
    micros = round((now - whole) * 1e6)
    if micros >= 1_000_000:  # rounded up into the next second
        return _iso_utc(float(whole + 1))
    return f"{_second.text}.{micros:06d}Z" if micros else f"{_second.text}Z"


def _render(_logger: Any, _method_name: str, event_dict: EventDict) -> str:
    """The line's JSON: orjson, at a fifth of the stdlib's cost; what orjson refuses (an int past
    64 bits, a lone surrogate) goes through the stdlib. Anything JSON has no type for is its
    ``repr``, as structlog's JSONRenderer wrote it."""
    try:
        return orjson.dumps(event_dict, default=_fallback, option=_ORJSON_OPTIONS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(event_dict, default=_fallback)


# Dataclasses and datetimes go to _fallback (repr), as with the stdlib renderer before.
_ORJSON_OPTIONS = (
    orjson.OPT_NON_STR_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
)


def _fallback(value: Any) -> Any:
    structlog_form = getattr(value, "__structlog__", None)
    return structlog_form() if structlog_form is not None else repr(value)


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

    def msg(self, message: str) -> None:
        """Write one rendered log line: the stream is structlog's logger itself, so no logger
        object is made per call (structlog's WriteLogger was, with a lock of its own)."""
        self.write(message + "\n")

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg

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
            structlog.contextvars.merge_contextvars,
            _level_and_time,
            _stack_and_exception,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=lambda *_args: stream,
        # Not cached: a later configure_logging (tests, `coordinator up`) must take effect on
        # module-level loggers that were already used.
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _render,
            ],
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                _level_and_time,
                structlog.stdlib.add_logger_name,
            ],
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
