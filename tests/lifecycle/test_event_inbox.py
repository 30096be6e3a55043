"""A follower's inbox (store/lifecycle/event_inbox.py), pure: full at its count of events or at
its bytes, whichever comes first; a reader that takes batches makes room again."""

from __future__ import annotations

from coordinator.store.etcd.watch import WatchEvent
from coordinator.store.lifecycle.event_inbox import Inbox


def _batch(revision: int, size: int = 3_000) -> list[WatchEvent]:
    return [WatchEvent(key="e", deleted=False, value=b"v" * (size - 1), mod_revision=revision)]


def test_an_inbox_is_full_at_its_bytes_long_before_its_count() -> None:
    """10,000 events of 2 KB held 19 MB a follow: 50 follows that did not read took a replica
    past 1 GiB."""
    told: list[str] = []
    inbox = Inbox(10_000, 0.05, lambda: told.append("behind"), byte_capacity=10_000)
    for revision in range(4):  # 12,000 bytes: full, at 4 events of its 10,000
        inbox.put(_batch(revision))
    assert not inbox.behind()
    assert inbox.get(0.0) == _batch(0)  # a reader that takes one makes room for one more
    inbox.put(_batch(4))
    inbox.put(_batch(5))  # full again, and nobody reads: behind after its patience
    assert inbox.behind() and told == ["behind"]


def test_small_events_fill_it_by_count() -> None:
    inbox = Inbox(3, 0.05, lambda: None, byte_capacity=10_000)
    for revision in range(4):
        inbox.put(_batch(revision, size=10))
    assert inbox.behind()
