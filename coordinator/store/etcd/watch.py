"""A prefix watch of our own, on the client's generated Watch stub.

The ``etcd3`` client's watcher thread dies with a NameError (``six`` is used but not imported
in python3-etcd3 0.13's watch.py) when its stream breaks, and then never tells its callbacks.
A watch that silently stops would leave the ready index stale forever, so this one owns its
stream: it resumes from the last revision it saw after a transport error, and reports a
compaction (history it can no longer replay) to its owner, who reloads.

Several keys often change in one revision (group commit nests a replica's concurrent txns into
one). Resuming from ``last revision + 1`` is still exact because etcd never splits a revision
across watch responses (its "atomic" watch guarantee; fragmenting is not requested here), so
every response ends on a whole revision. Owners get each response's events together and must
handle all of them (tests/store/test_shared_revisions.py holds each owner to that).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from etcd3 import etcdrpc, utils
from etcd3.etcdrpc import kv_pb2

log = structlog.get_logger(__name__)

_RETRY_DELAY = 0.5


@dataclass(frozen=True)
class WatchEvent:
    """One key change seen by a watch."""

    key: str
    deleted: bool
    value: bytes
    mod_revision: int


class HistoryCompacted(Exception):
    """The watch cannot resume: etcd compacted the revisions it would need."""


class PrefixWatch:
    """Follows every change under a prefix from ``start_revision`` in a daemon thread."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        *,
        start_revision: int,
        on_events: Callable[[list[WatchEvent]], None],
        on_compacted: Callable[[], None],
        deletes_only: bool = False,
        range_end: str = "",
    ) -> None:
        # ``deletes_only``: etcd filters out puts (NOPUT) before they cross the wire.
        # ``range_end``: follow [prefix, range_end) instead of the prefix alone, so keys of two
        # neighbouring prefixes changed in one revision arrive in one response (the reclaimer).
        self._client = client
        self._filters = [etcdrpc.WatchCreateRequest.NOPUT] if deletes_only else []
        self._prefix = prefix.encode()
        self._range_end = range_end.encode() if range_end else utils.prefix_range_end(self._prefix)
        self._next_revision = start_revision
        self._on_events = on_events
        self._on_compacted = on_compacted
        self._stop = threading.Event()
        self._call: Any = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"watch {prefix}", daemon=True)

    def start(self) -> PrefixWatch:
        """Start following."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop following (and wait for the thread)."""
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._stream()
            except HistoryCompacted:
                log.warning("watch history compacted; owner reloads", prefix=self._prefix.decode())
                self._on_compacted()
                return
            except Exception as exc:
                # Anything else (a broken stream, or the client refusing a channel while every
                # endpoint is marked failed) is transient: a watch that stopped for good would
                # fail silently, so resume from the last revision seen.
                if self._stop.is_set():
                    return
                log.warning("watch broken; resuming", prefix=self._prefix.decode(), error=str(exc))
            self._stop.wait(_RETRY_DELAY)

    def _stream(self) -> None:
        requests: queue.Queue[Any] = queue.Queue()
        requests.put(
            etcdrpc.WatchRequest(
                create_request=etcdrpc.WatchCreateRequest(
                    key=self._prefix,
                    range_end=self._range_end,
                    start_revision=self._next_revision,
                    filters=self._filters,
                )
            )
        )

        def request_iter() -> Iterator[Any]:
            while True:
                item = requests.get()
                if item is None:
                    return
                yield item

        stub = etcdrpc.WatchStub(self._client.channel)
        with self._lock:
            if self._stop.is_set():
                return
            self._call = stub.Watch(
                request_iter(),
                credentials=self._client.call_credentials,
                metadata=self._client.metadata,
            )
        try:
            for response in self._call:
                if response.compact_revision:
                    raise HistoryCompacted(response.compact_revision)
                if response.canceled:
                    raise HistoryCompacted(0)
                events = [_event(e) for e in response.events]
                if events:
                    self._next_revision = events[-1].mod_revision + 1
                    self._on_events(events)
        finally:
            requests.put(None)


def _event(raw: Any) -> WatchEvent:
    return WatchEvent(
        key=raw.kv.key.decode(),
        deleted=raw.type == kv_pb2.Event.DELETE,
        value=bytes(raw.kv.value),
        mod_revision=int(raw.kv.mod_revision),
    )
