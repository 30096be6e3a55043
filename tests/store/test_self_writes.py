"""A replica's own claim -> commit cycle costs its watches, and the reclaimer and releaser they
feed, no record decode; another replica's writes are still seen by both."""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

from coordinator.domain import records
from coordinator.domain.states import TaskState
from coordinator.store import Store
from coordinator.store.etcd.watch import WatchEvent
from tests.helpers import eventually
from tests.lifecycle.support import claim, create, finish
from tests.store.support import StoreFactory

OWN = "own-cycle-task"


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bytes]]:
    """(thread name, bytes) of every record decode from now on: the codec's ``decode`` is
    wrapped in every coordinator module that imported it."""
    seen: list[tuple[str, bytes]] = []
    original = records.decode

    def counting(cls: Any, data: bytes, **metadata: Any) -> Any:
        seen.append((threading.current_thread().name, bytes(data)))
        return original(cls, data, **metadata)

    for name, module in list(sys.modules.items()):
        if name.startswith("coordinator") and getattr(module, "decode", None) is original:
            monkeypatch.setattr(module, "decode", counting)
    return seen


def _background(decoded: list[tuple[str, bytes]]) -> list[bytes]:
    """What the watch threads and the loops they feed decoded."""
    return [data for thread, data in decoded if thread.startswith("watch ") or thread in LOOPS]


LOOPS = ("reclaimer", "releaser")


def test_own_cycle_costs_no_decode_and_another_replicas_writes_are_seen(
    make_store: StoreFactory, etcd_client: Any, decoded: list[tuple[str, bytes]]
) -> None:
    own = make_store()
    other = make_store(reclaim=False)
    other.releaser.close()  # only ``own``'s loops may act on ``other``'s writes below
    create(own, OWN)
    finish(own, OWN)
    # Another replica's writes, after the own cycle (each watch sees them in revision order):
    # an upstream's commit the releaser must act on, and a claim whose lease ends (not by a
    # commit) that the reclaimer must take back.
    create(other, "upstream")
    create(other, "dependent", depends_on=("upstream",))
    create(other, "expires")
    claim(other, "expires")
    finish(other, "upstream")
    etcd_client.revoke_lease(other.tasks.get("expires").lease_id)
    eventually(
        lambda: own.tasks.get("dependent").state is TaskState.READY,
        message="own replica's releaser did not see the other replica's commit",
    )
    eventually(
        lambda: own.tasks.get("expires").state is TaskState.READY,
        message="own replica's reclaimer did not see the other replica's ended lease",
    )
    background = _background(decoded)
    assert [data for data in background if OWN.encode() in data] == []
    assert any(b"expires" in data for data in background)  # the reclaim read its record


def test_the_releasers_screen_passes_every_settling_event_and_skips_a_claim(
    store: Store,
) -> None:
    store.releaser.close()  # no watch: events are fed by hand
    create(store, "a")
    create(store, "b")
    create(store, "c")
    finish(store, "a")
    claim(store, "b")
    store.tasks.cancel("c", by="pm", reason="no longer needed")
    keys = store.ctx.keys
    found = store.ctx.kv.range_page(
        keys.events_prefix(), store.ctx.kv.prefix_end(keys.events_prefix())
    )[0]
    events = [WatchEvent(kv.key, False, kv.value, kv.mod_revision) for kv in found]
    assert sorted(store.releaser.items_from(events)) == ["a", "c"]  # DONE, CANCELLED; no claim
