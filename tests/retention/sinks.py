"""The base of the tests' archive sinks: a real sink inside, its URL and reads as they are; a
test's sink overrides ``write`` to do something around the real write (fail, count, move the
task, open a reconciliation, lose etcd, die)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from coordinator.archive import ArchiveSink


class WrappedSink:
    """Everything through ``inner``; subclasses change ``write``."""

    def __init__(self, inner: ArchiveSink) -> None:
        self.inner = inner
        self.url = inner.url

    def write(self, objects: Sequence[dict[str, Any]]) -> str:
        return self.inner.write(objects)

    def read(self) -> Iterator[dict[str, Any]]:
        return self.inner.read()
