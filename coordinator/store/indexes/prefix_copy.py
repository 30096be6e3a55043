"""An in-memory copy of one etcd prefix, loaded once (paged) and kept current by a watch.

The ready index and the claimed index both need this: read every key under a prefix at one
revision, follow the changes from the next revision, and when etcd compacted the history the
watch needs, load again (what the copy missed is exactly what a fresh load has). A copy that
stopped following would go stale silently, so the reload retries until etcd answers.
"""

from __future__ import annotations

import time

import structlog

from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import KV
from coordinator.store.etcd.watch import PrefixWatch, WatchEvent

log = structlog.get_logger(__name__)

_PAGE = 1000


class PrefixCopy:
    """Subclasses say what a full load means (``replace``) and what a watch batch means
    (``apply``); both run under the subclass's own lock."""

    def __init__(self, ctx: StoreContext, root: str, *, keys_only: bool) -> None:
        self._ctx = ctx
        self._root = root
        self._keys_only = keys_only
        self._watch: PrefixWatch | None = None
        self._closed = False

    def start(self) -> None:
        """Load the copy and start following it."""
        self._reload()

    def close(self) -> None:
        """Stop the watch."""
        self._closed = True
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def replace(self, items: list[KV]) -> None:
        """Every key under the root, read at one revision: the copy is exactly these now."""
        raise NotImplementedError

    def apply(self, events: list[WatchEvent]) -> None:
        """One watch response's events (a whole number of revisions), in order."""
        raise NotImplementedError

    def loaded(self, revision: int) -> None:
        """The full load just replaced was read at ``revision`` (the watch follows from the
        next one). Nothing by default."""

    def _reload(self) -> None:
        kv = self._ctx.kv
        items: list[KV] = []
        start, end = self._root, kv.prefix_end(self._root)
        revision = 0
        while True:
            page, revision = kv.range_page(
                start, end, limit=_PAGE, revision=revision, keys_only=self._keys_only
            )
            items += page
            if len(page) < _PAGE:
                break
            start = page[-1].key + "\0"
        self.replace(items)
        self.loaded(revision)
        self._watch = kv.watch_prefix(
            self._root,
            start_revision=revision + 1,
            on_events=self.apply,
            on_compacted=self._reload_quietly,
        )

    def _reload_quietly(self) -> None:
        # Runs on the broken watch's own thread, which ends right after this returns.
        while not self._closed:
            try:
                self._reload()
                return
            except Exception as exc:
                log.error("prefix copy reload failed; retrying", root=self._root, error=str(exc))
                time.sleep(1.0)
