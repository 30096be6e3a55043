"""How a WorkerPool says whether it is claiming: a file a probe can test for.

Kubernetes takes a pod out of rotation on a failing readiness probe, and an operator or a
script wants to know when a worker stopped taking work. The pool sets its signals ready once
its claim loops run, and unready first thing on shutdown, before it waits for its handlers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Readiness(Protocol):
    """Something that reflects whether a pool is claiming."""

    def set_ready(self, ready: bool) -> None:
        """Claiming (True) or not any more (False)."""
        ...


class ReadyFile:
    """A file that exists exactly while the pool claims (``exec: test -f PATH`` as a probe)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def set_ready(self, ready: bool) -> None:
        """Create the file (atomically: a probe never sees it half written) or remove it."""
        if not ready:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return
        partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        partial.write_text(f"claiming pid={os.getpid()}\n")
        partial.replace(self.path)

    def __repr__(self) -> str:
        return f"ReadyFile({str(self.path)!r})"


def set_all(signals: Iterable[Readiness], ready: bool) -> None:
    """Set every one of a pool's ``signals``: one that cannot be set ready is a setup error
    (raised); one that cannot be cleared is logged, as the shutdown must go on."""
    for signal_ in signals:
        if ready:
            signal_.set_ready(True)
            continue
        try:
            signal_.set_ready(False)
        except OSError as exc:
            log.warning("could not clear readiness", readiness=repr(signal_), error=str(exc))
