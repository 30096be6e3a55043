"""The default sink: a local directory of gzip-compressed JSON Lines files, one object a line.

Each write appends one complete gzip member to the current file and fsyncs it before it returns
(a gzip file may hold several members; ``zcat`` and Python's gzip read them as one stream), so a
confirmed write survives a crash, and a crash mid-write leaves at most a truncated last member,
which readers skip. Files rotate by size and age; their names carry host, pid and creation time,
so several replicas may share one directory.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from coordinator.archive.sink import ArchiveError
from coordinator.errors import ConfigError

ROTATE_BYTES = 64 << 20
"""A file is closed once it holds this many compressed bytes."""
ROTATE_SECONDS = 3600.0
"""... or once it is this old."""
SUFFIX = ".jsonl.gz"


class LocalSink:
    """Archive to ``directory`` (created if missing; must be writable)."""

    def __init__(
        self,
        directory: Path,
        *,
        setting: str = "archive",
        rotate_bytes: int = ROTATE_BYTES,
        rotate_seconds: float = ROTATE_SECONDS,
    ) -> None:
        self._dir = directory.absolute()
        self._rotate_bytes = rotate_bytes
        self._rotate_seconds = rotate_seconds
        self._lock = threading.Lock()
        self._current: Path | None = None
        self._opened = 0.0
        self._seq = 0
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{setting}: cannot create {str(self._dir)!r}: {exc}") from exc
        if not self._dir.is_dir() or not os.access(self._dir, os.W_OK | os.X_OK):
            raise ConfigError(f"{setting}: {str(self._dir)!r} is not a writable directory")

    @property
    def url(self) -> str:
        """``file://`` + the directory."""
        return self._dir.as_uri()

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        """Append ``objects`` as one gzip member and fsync; returns the file's URL."""
        if not objects:
            return self.url
        lines = "".join(_line(o) for o in objects)
        member = gzip.compress(lines.encode(), compresslevel=6)
        with self._lock:
            path = self._file()
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    os.write(fd, member)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                self._current = None  # start a fresh file next time
                raise ArchiveError(f"archive write to {str(path)!r} failed: {exc}") from exc
            return path.as_uri()

    def _file(self) -> Path:
        now = time.time()
        current = self._current
        if current is not None:
            try:
                size = current.stat().st_size
            except OSError:
                size = self._rotate_bytes
            if size < self._rotate_bytes and now - self._opened < self._rotate_seconds:
                return current
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
        name = f"archive-{stamp}-{socket.gethostname()}-{os.getpid()}-{self._seq}{SUFFIX}"
        self._current, self._opened = self._dir / name, now
        return self._current

    def read(self) -> Iterator[dict[str, Any]]:
        """Every object of every file, files in name (creation time) order."""
        for path in sorted(self._dir.glob(f"*{SUFFIX}")):
            yield from read_file(path)


def read_file(path: Path) -> Iterator[dict[str, Any]]:
    """The objects of one archive file; a truncated last member (a crash mid-write, never
    confirmed) ends the file."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)
    except (EOFError, zlib.error, gzip.BadGzipFile, ValueError):
        return  # ValueError: the partial last line of a truncated member
    except OSError as exc:
        raise ArchiveError(f"cannot read archive file {str(path)!r}: {exc}") from exc


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n"
