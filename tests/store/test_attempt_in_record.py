"""Schema 3: a task's current attempt in its task record alone (``attempt_in_record``).

A claim writes no attempt key and a commit leaves the committed attempt in the record; any other
move gives the attempt its key first (store/transition.py), and a key, once written, wins over
the record. Each test asserts both where the attempt lives and what every reader makes of it.
"""

from __future__ import annotations

from typing import Any

from coordinator.clock import ManualClock
from coordinator.domain.digests import digest_of
from coordinator.domain.records import AttemptRecord, decode
from coordinator.domain.states import AttemptEnd, FenceReason, Outcome, TaskState
from coordinator.domain.versions import ATTEMPT_IN_RECORD_SCHEMA, VersionRecord
from coordinator.store import Store
from coordinator.store.attempts import acceptance, views
from coordinator.store.control.versions import VersionStore
from tests.helpers import eventually
from tests.store.support import StoreFactory, claim, commit, create, raw, wait_claim_gone


def _attempt_key(store: Store, etcd_client: Any, task_id: str, attempt_id: str) -> AttemptRecord:
    value, _ = etcd_client.get(store.ctx.keys.attempt(task_id, attempt_id))
    assert value is not None, f"attempt {attempt_id} of {task_id} has no key"
    return decode(AttemptRecord, value)


def _ends(store: Store, task_id: str) -> list[AttemptEnd]:
    return [a.end for a in store.tasks.attempts(task_id)]


def test_a_committed_attempt_lives_in_the_record_and_reads_as_a_keyed_one(
    store: Store, etcd_client: Any, clock: ManualClock
) -> None:
    create(store, "t")
    fence = claim(store, "t", ttl=20)
    started = clock.now()
    (running,) = store.tasks.attempts("t")
    assert (running.end, running.started_at, running.ttl) == (AttemptEnd.RUNNING, started, 20)
    assert running.claim_generation == fence.claim_generation
    clock.advance(5)
    assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
    task = store.tasks.get("t")
    assert (task.state, task.attempt_in_record) == (TaskState.DONE, True)
    assert raw(etcd_client, store.ctx.keys.attempt("t", fence.attempt_id)) is None
    (done,) = store.tasks.attempts("t")
    assert (done.end, done.started_at, done.ended_at) == (
        AttemptEnd.COMMITTED,
        started,
        started + 5,
    )
    assert (done.attempt_id, done.claim_generation) == (fence.attempt_id, fence.claim_generation)
    assert done.input_digest == digest_of(b"input of t")


def test_a_checkpoint_gives_the_attempt_a_key_which_the_commit_then_closes(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t")
    fence = claim(store, "t")
    renewed = store.renewals.renew(fence, principal="w1", progress="", checkpoint=b"step 3")
    assert renewed.verdict.outcome is Outcome.OK
    assert _attempt_key(store, etcd_client, "t", fence.attempt_id).checkpoint == b"step 3"
    assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
    closed = _attempt_key(store, etcd_client, "t", fence.attempt_id)
    assert (closed.end, closed.checkpoint) == (AttemptEnd.COMMITTED, b"step 3")
    assert store.tasks.get("t").attempt_in_record is False
    assert _ends(store, "t") == [AttemptEnd.COMMITTED]


def test_a_release_writes_the_attempt_closed_to_its_key(store: Store, etcd_client: Any) -> None:
    create(store, "t")
    fence = claim(store, "t")
    assert store.acceptance.release(fence, principal="w1", reason="busy").outcome is Outcome.OK
    assert _attempt_key(store, etcd_client, "t", fence.attempt_id).end is AttemptEnd.RELEASED
    assert store.tasks.get("t").attempt_in_record is False
    second = claim(store, "t")
    assert commit(store, second).verdict.outcome is Outcome.COMMITTED
    assert _ends(store, "t") == [AttemptEnd.RELEASED, AttemptEnd.COMMITTED]


def test_a_reclaim_and_a_takeover_close_the_recorded_attempt_as_expired(
    make_store: StoreFactory, etcd_client: Any, clock: ManualClock
) -> None:
    store = make_store(reclaim=False)
    for task_id in ("reclaimed", "taken"):
        create(store, task_id)
    first = {t: claim(store, t, ttl=1) for t in ("reclaimed", "taken")}
    for task_id in first:
        wait_claim_gone(store, etcd_client, task_id)
    clock.advance(3)
    taken = claim(store, "taken", principal="w2")  # the takeover: one txn
    assert store.reclaimer.scan() == 1
    for task_id, fence in first.items():
        closed = _attempt_key(store, etcd_client, task_id, fence.attempt_id)
        assert (closed.end, closed.ended_at) == (AttemptEnd.EXPIRED, clock.now())
    assert _ends(store, "reclaimed") == [AttemptEnd.EXPIRED]
    assert _ends(store, "taken") == [AttemptEnd.EXPIRED, AttemptEnd.RUNNING]
    assert raw(etcd_client, store.ctx.keys.attempt("taken", taken.attempt_id)) is None


def test_a_move_after_the_commit_gives_the_committed_attempt_its_key_first(
    store: Store, etcd_client: Any
) -> None:
    create(store, "t", review=True)
    fence = claim(store, "t")
    assert commit(store, fence).verdict.outcome is Outcome.COMMITTED
    assert store.tasks.get("t").attempt_in_record is True
    store.review.reject("t", revision=1, reviewer="pm", reason="again")
    kept = _attempt_key(store, etcd_client, "t", fence.attempt_id)
    assert (kept.end, kept.claim_generation) == (AttemptEnd.COMMITTED, fence.claim_generation)
    assert store.tasks.get("t").attempt_in_record is False
    second = claim(store, "t")
    assert _ends(store, "t") == [AttemptEnd.COMMITTED, AttemptEnd.RUNNING]
    assert [a.attempt_id for a in store.tasks.attempts("t")] == [
        fence.attempt_id,
        second.attempt_id,
    ]


def test_producer_moves_of_a_claimed_task_close_its_recorded_attempt(
    store: Store, etcd_client: Any
) -> None:
    create(store, "changed")
    create(store, "cancelled")
    changed, cancelled = claim(store, "changed"), claim(store, "cancelled")
    store.tasks.update_input(
        "changed", data=b"v2", input_digest=digest_of(b"v2"), expected_revision=1, by="pm"
    )
    store.tasks.cancel("cancelled", by="pm", reason="stop")
    stale = _attempt_key(store, etcd_client, "changed", changed.attempt_id)
    assert (stale.end, stale.revision) == (AttemptEnd.STALE_INPUT, 1)
    assert stale.input_digest == digest_of(b"input of changed")
    assert _attempt_key(store, etcd_client, "cancelled", cancelled.attempt_id).end is (
        AttemptEnd.CANCELLED
    )
    assert commit(store, changed).verdict.outcome is Outcome.STALE_INPUT


def test_a_keyspace_at_schema_2_keeps_attempt_keys_until_the_raise(
    make_store: StoreFactory, etcd_client: Any, prefix: str
) -> None:
    etcd_client.put(f"{prefix}/meta/versions", VersionRecord(schema_version=2).encode())
    store = make_store()
    create(store, "old")
    fence = claim(store, "old")
    assert _attempt_key(store, etcd_client, "old", fence.attempt_id).end is AttemptEnd.RUNNING
    assert store.tasks.get("old").attempt_in_record is False
    VersionStore(store.ctx).set_minimums(schema_version=ATTEMPT_IN_RECORD_SCHEMA)
    eventually(lambda: store.ctx.writes_schema(ATTEMPT_IN_RECORD_SCHEMA), message="not raised")
    # The raise bumps the epoch: no claim of the old layout is committed under the new one.
    assert commit(store, fence).verdict.reason is FenceReason.EPOCH_CHANGED
    create(store, "new")
    claim(store, "new", epoch=2)
    assert store.tasks.get("new").attempt_in_record is True


def test_a_checkpoint_landing_between_a_commits_read_and_its_txn_is_closed_by_the_commit(
    make_store: StoreFactory, etcd_client: Any, monkeypatch: Any
) -> None:
    """A keepalive's checkpoint may race the holder's own commit through another replica (or
    one restarted since the claim): the commit read no attempt key, the checkpoint then wrote
    one (RUNNING). The commit must not leave the attempt in the record beside that key, which
    wins for every reader: a DONE task with a RUNNING attempt."""
    granting, other = make_store(), make_store()
    create(granting, "t")
    fence = claim(granting, "t")
    real = views.aread_view
    raced: list[Outcome] = []

    async def read_then_checkpoint(*args: Any, **kwargs: Any) -> Any:
        view = await real(*args, **kwargs)
        if not raced:
            renewed = granting.renewals.renew(fence, principal="w1", progress="", checkpoint=b"s")
            raced.append(renewed.verdict.outcome)
        return view

    monkeypatch.setattr(acceptance, "aread_view", read_then_checkpoint)
    assert commit(other, fence).verdict.outcome is Outcome.COMMITTED
    assert raced == [Outcome.OK]
    closed = _attempt_key(other, etcd_client, "t", fence.attempt_id)
    assert (closed.end, closed.checkpoint) == (AttemptEnd.COMMITTED, b"s")
    assert other.tasks.get("t").attempt_in_record is False
    assert _ends(other, "t") == [AttemptEnd.COMMITTED]
