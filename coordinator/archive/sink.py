"""The sink contract, the URL that names a sink, and what readers share."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from coordinator.errors import ConfigError, CoordinatorError


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


def open_sink(url: str, *, setting: str = "archive") -> ArchiveSink:
    """The sink named by ``url``: a directory path (``~`` expanded) or ``file://`` URL, or
    ``s3://bucket/prefix``
    (query: ``endpoint_url``, ``region``). ConfigError naming ``setting`` if unusable."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        from coordinator.archive.s3 import S3Sink  # boto3 only when S3 is used

        return S3Sink.from_url(url, setting=setting)
    if parts.scheme in ("", "file"):
        from coordinator.archive.local import LocalSink

        path = parts.path if parts.scheme == "file" else os.path.expanduser(url)
        if not path:
            raise ConfigError(f"{setting}: give a directory or an s3:// URL")
        return LocalSink(Path(path), setting=setting)
    raise ConfigError(
        f"{setting}: unsupported archive {url!r}; give a directory, file:///dir or s3://bucket/prefix"
    )


def check_sink(url: str, *, setting: str = "archive") -> None:
    """Refuse (ConfigError naming ``setting``) an archive that cannot work, creating nothing: a
    local path must be a writable directory or creatable under a writable one; an s3:// URL
    must name a bucket, and boto3 must be installed."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        open_sink(url, setting=setting)  # builds a client; no network call
        return
    if parts.scheme not in ("", "file"):
        open_sink(url, setting=setting)  # raises, naming the scheme
    path = Path(parts.path if parts.scheme == "file" else os.path.expanduser(url)).absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if existing != path and not existing.is_dir():
        raise ConfigError(f"{setting}: {str(existing)!r} is not a directory")
    if existing == path and not path.is_dir():
        raise ConfigError(f"{setting}: {str(path)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{setting}: {str(existing)!r} is not writable")


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
