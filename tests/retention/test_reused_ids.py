"""A task id used again after its tombstone expired is another task: its effects get new ids,
so a downstream that dedupes by effect id never skips them as the archived task's (real etcd,
local archive, ManualClock). And a task created before effect ids named the incarnation keeps
resolving its effects to the ids they were prepared with."""

from __future__ import annotations

import json
from typing import Any

from coordinator.archive.local import LocalSink
from coordinator.clock import ManualClock
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.effect_ids import legacy_effect_id
from coordinator.domain.effects import EffectAction, EffectRecord, EffectState
from coordinator.domain.records import encode
from coordinator.domain.states import Outcome
from coordinator.store import Store
from coordinator.store.effects.effect import PrepareResult
from tests.retention.conftest import RETENTION, TOMBSTONE_RETENTION
from tests.store.support import claim, commit, create

PAYLOAD = digest_of(b"to: ops\n\nthe report is ready")


def _prepare(store: Store, fence: Fence) -> PrepareResult:
    """Prepare the slot notify/email with PAYLOAD."""
    return store.effects.prepare(
        fence, principal="w1", node_id="notify", effect_slot="email", payload_digest=PAYLOAD
    )


def _sent(store: Store, task_id: str) -> str:
    """Claim ``task_id``, prepare notify/email, record it COMMITTED, commit; its effect id."""
    fence = claim(store, task_id)
    prepared = _prepare(store, fence)
    assert prepared.action is EffectAction.EXECUTE and prepared.effect is not None
    eid = prepared.effect.effect_id
    recorded = store.effects.record(
        fence,
        principal="w1",
        effect_id=eid,
        state=EffectState.COMMITTED,
        external_ref="msg-1",
        etag="",
    )
    assert recorded.verdict.outcome is Outcome.OK
    assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
    return eid


def test_a_task_created_again_after_its_tombstone_expired_gets_new_effect_ids(
    make_store: Any, clock: ManualClock, sink: LocalSink
) -> None:
    store = make_store()
    create(store, "t1")
    first = _sent(store, "t1")
    assert store.pruner is not None
    clock.advance(RETENTION + 1)
    assert store.pruner.run_pass().pruned == 1
    (archived,) = list(sink.read())
    (effect_entry,) = archived["effects"]
    assert effect_entry["value"]["effect_id"] == first
    clock.advance(TOMBSTONE_RETENTION + 1)
    assert store.pruner.run_pass().tombstones_expired == 1

    create(store, "t1")  # the same id, the same revision 1, the same node and slot
    again = _prepare(store, claim(store, "t1"))

    assert again.effect is not None and again.action is EffectAction.EXECUTE
    assert again.effect.effect_id != first  # a downstream deduping by it sends the new one
    assert again.effect.task_revision == 1 == effect_entry["value"]["task_revision"]


def test_a_task_written_before_the_scheme_keeps_its_effect_ids(
    make_store: Any, etcd_client: Any
) -> None:
    """A task record as a release before the scheme wrote it (no effect_ids field) with an
    effect COMMITTED under its V1 id: the next attempt's prepare of the slot finds that effect
    (SKIP) instead of making a new id, so nothing is sent twice across the upgrade."""
    store = make_store()
    keys = store.ctx.keys
    create(store, "old")
    raw, _ = etcd_client.get(keys.task("old"))
    stored = json.loads(raw)
    assert stored.pop("effect_ids") == "V2"
    etcd_client.put(keys.task("old"), json.dumps(stored, separators=(",", ":"), sort_keys=True))
    v1 = legacy_effect_id("old", 1, "notify", "email")
    sent = EffectRecord(
        effect_id=v1,
        task_id="old",
        task_revision=1,
        node_id="notify",
        effect_slot="email",
        payload_digest=PAYLOAD,
        state=EffectState.COMMITTED,
        prepared_generation=1,
        prepared_attempt_id="a-before",
        prepared_by="w0",
        prepared_at=1.0,
        external_ref="msg-before",
    )
    etcd_client.put(keys.effect(v1), encode(sent))
    etcd_client.put(keys.task_effect("old", v1), b"")

    prepared = _prepare(store, claim(store, "old"))

    assert prepared.effect is not None
    assert (prepared.action, prepared.effect.effect_id) == (EffectAction.SKIP, v1)
    assert prepared.effect.external_ref == "msg-before"
