"""Logging: structlog JSON lines on stderr, one event per line, level configurable.

Worker calls bind ``task_id``, ``attempt``, ``generation`` and ``epoch`` with ``bound(...)`` so
that every line logged during the call (ours and the store's) carries them. Records from the
standard library (grpc, etcd3) go through the same renderer, so stderr is JSON throughout.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Bind ``fields`` to every log line of the current call (thread- and context-local)."""
    with structlog.contextvars.bound_contextvars(**fields):
        yield
