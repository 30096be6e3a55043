"""The sink contract, and what readers share (the factory that opens a sink from its URL is
``archive/factory.py``: it imports the sinks, which import this contract)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from coordinator.errors import CoordinatorError


class ArchiveError(CoordinatorError):
    """The sink did not confirm a write (nothing may be pruned), or cannot be read."""


class ArchiveSink(Protocol):
    """Durable storage for archive objects."""

    @property
    def url(self) -> str:
        """The sink's own URL (what ``archive`` names)."""
        ...

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        """Store ``objects`` durably; returns where they went. ArchiveError if not confirmed."""
        ...

    def read(self) -> Iterator[dict[str, Any]]:
        """Every archived object, oldest write first (copies of one task included)."""
        ...


def latest_copies(objects: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The latest archived copy of each task (a task archived twice has two identical ones
    except for ``archived_at``), by task id. Objects of another ``kind`` (the records of an
    ended attempt, swept before its task was pruned) are not tasks: see ``latest_swept``."""
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        if obj.get("kind"):
            continue
        task_id = str(obj.get("task_id", ""))
        kept = found.get(task_id)
        if kept is None or float(obj.get("archived_at", 0)) >= float(kept.get("archived_at", 0)):
            found[task_id] = obj
    return found


def latest_swept(objects: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The latest archived copy of each ended attempt's swept records, by (task, attempt)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in objects:
        if obj.get("kind") != "ended_attempt":
            continue
        key = (str(obj.get("task_id", "")), str(obj.get("attempt_id", "")))
        kept = found.get(key)
        if kept is None or float(obj.get("archived_at", 0)) >= float(kept.get("archived_at", 0)):
            found[key] = obj
    return found
