"""etcd compaction under the coordinator's feet (the Helm chart turns auto-compaction on): a
watch whose history was compacted reports it, and the reclaimer then scans and follows anew, so
no expired claim is lost and later expiries are still seen at once."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import etcd3
import pytest

from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.store import EtcdKV, EventFilter, Keyspace, Store, StoredEvent, TaskSpec
from coordinator.store.etcd.watch import WatchEvent
from tests.conftest import GRPC_OPTIONS
from tests.helpers import eventually
from tests.store.support import LIMITS, claim, commit, create

READY = "READY"


@pytest.fixture
def compacting() -> Iterator[tuple[EtcdKV, Any]]:
    """An etcd of its own (compacting the shared one would rewrite other tests' history)."""
    # Compaction off: each test compacts by hand, at the revision it chooses.
    with EtcdProcess(binary=find_etcd_binary(), compaction_retention=None) as proc:
        kv = EtcdKV.connect([proc.endpoint])
        client = etcd3.client(proc.host, proc.port, grpc_options=GRPC_OPTIONS)
        try:
            yield kv, client
        finally:
            client.close()
            kv.close()


def _compact_now(kv: EtcdKV, client: Any) -> int:
    _, revision = kv.range_page("/", "0")
    client.compact(revision)
    return revision


def test_a_watch_from_compacted_history_reports_it(compacting: tuple[EtcdKV, Any]) -> None:
    kv, client = compacting
    for i in range(5):
        client.put(f"/w/k{i}", b"v")
    _compact_now(kv, client)
    compacted = threading.Event()
    seen: list[WatchEvent] = []
    watch = kv.watch_prefix(
        "/w/", start_revision=1, on_events=seen.extend, on_compacted=compacted.set
    )
    try:
        assert compacted.wait(10), "the watch never reported the compaction"
        assert seen == []
    finally:
        watch.close()


def test_the_reclaimer_survives_a_compacted_watch_revision(
    compacting: tuple[EtcdKV, Any],
) -> None:
    kv, client = compacting
    # A scan interval no test waits for: only the rescan on compaction and the new watch can
    # reclaim anything below.
    # Retries at once: the default backoff would park each reclaimed task DELAYED, and no
    # promoter runs here; this test is about the reclaimer finding the claims at all.
    store = Store.open(kv, keys=Keyspace("/c"), scan_interval=3600.0, limits=LIMITS)
    store.start(reclaim=False)
    try:
        create(store, "hidden")
        create(store, "later")
        hidden = claim(store, "hidden", ttl=60)
        # The claim ends while no watch follows, and etcd then forgets that history.
        kv.revoke(store.tasks.get("hidden").lease_id)
        _compact_now(kv, client)

        store.reclaimer.start(from_revision=1)
        eventually(lambda: store.tasks.get("hidden").state.name == READY, timeout=10)

        claim(store, "later", ttl=60)
        kv.revoke(store.tasks.get("later").lease_id)
        eventually(lambda: store.tasks.get("later").state.name == READY, timeout=10)
        assert hidden.claim_generation < store.tasks.get("hidden").state_version
    finally:
        store.close()


def test_the_releaser_survives_a_compacted_watch_revision(
    compacting: tuple[EtcdKV, Any],
) -> None:
    kv, client = compacting
    store = Store.open(kv, keys=Keyspace("/r"), scan_interval=3600.0)
    store.start(reclaim=False)  # neither reclaimer nor releaser runs yet
    try:
        for upstream in ("up1", "up2"):
            create(store, upstream)
        store.tasks.create(TaskSpec(task_id="down1", depends_on=("up1",)), by="pm")
        store.tasks.create(TaskSpec(task_id="down2", depends_on=("up2",)), by="pm")
        # up1 becomes DONE while no watch follows, and etcd then forgets that history.
        commit(store, claim(store, "up1", ttl=60))
        _compact_now(kv, client)

        store.releaser.start(from_revision=1)
        eventually(lambda: store.tasks.get("down1").state.name == READY, timeout=10)

        commit(store, claim(store, "up2", ttl=60))
        # Only a watch that follows again can release this one: the scan runs hourly.
        eventually(lambda: store.tasks.get("down2").state.name == READY, timeout=10)
    finally:
        store.close()


def test_a_follower_from_compacted_history_reads_it_from_the_keys_then_follows_live(
    compacting: tuple[EtcdKV, Any],
) -> None:
    kv, client = compacting
    store = Store.open(kv, keys=Keyspace("/e"), scan_interval=3600.0)
    store.start(reclaim=False)
    received: queue.Queue[StoredEvent] = queue.Queue()
    stop = threading.Event()
    try:
        for name in ("a", "b", "c"):
            create(store, name)
        commit(store, claim(store, "a", ttl=60))
        _compact_now(kv, client)  # a watch from revision 1 can no longer replay them

        def pump() -> None:
            for event in store.events.follow(EventFilter(), alive=lambda: not stop.is_set()):
                received.put(event)

        threading.Thread(target=pump, daemon=True).start()
        old = [received.get(timeout=10) for _ in range(5)]
        assert [(e.record.task_id, e.record.op.value) for e in old] == [
            ("a", "create"),
            ("b", "create"),
            ("c", "create"),
            ("a", "claim"),
            ("a", "commit"),
        ]
        create(store, "d")
        assert received.get(timeout=10).record.task_id == "d"
        assert received.empty()
    finally:
        stop.set()
        store.close()
