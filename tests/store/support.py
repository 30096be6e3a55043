"""Helpers for the store tests: task setup, raw etcd reads and waits (via tests.helpers)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from coordinator.domain.decisions import ClaimLimits, Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.records import (
    AttemptRecord,
    EventRecord,
    ResultRecord,
    TaskRecord,
    decode,
    encode,
)
from coordinator.domain.states import AttemptEnd, Outcome
from coordinator.store import ClaimResult, CommitResult, Store, TaskSpec
from coordinator.store.context import new_attempt_id
from coordinator.store.control.versions import VersionStore
from coordinator.store.etcd.group_commit import GroupCommit
from coordinator.store.etcd.ops import put
from coordinator.store.etcd.watch import WatchEvent
from tests.helpers import RETRY_AT_ONCE, eventually

# Short limits for tests: TTLs in [1, 30] s (etcd itself raises TTLs below ~2 s).
LIMITS = ClaimLimits(
    min_ttl=1, max_ttl=30, max_claim_duration=600.0, stall_timeout=300.0, retry=RETRY_AT_ONCE
)
# Long enough that no periodic scan runs during a test: reclaims come from the watch or scan().
NO_SCAN = 3600.0

StoreFactory = Callable[..., Store]
"""``make_store(*, limits=LIMITS, reclaim=True, scan_interval=NO_SCAN, clock=...)``."""

RESULT = b"the result"
RESULT_DIGEST = digest_of(RESULT)


def create(
    store: Store,
    task_id: str,
    *,
    priority: int = 0,
    queue: str = "default",
    data: bytes | None = None,
    review: bool = False,
) -> None:
    """Create a READY task whose input is ``data`` (default: derived from the id)."""
    payload = data if data is not None else f"input of {task_id}".encode()
    spec = TaskSpec(
        task_id=task_id, queue=queue, priority=priority, input=payload, requires_review=review
    )
    store.tasks.create(spec, by="pm")


def claim(
    store: Store, task_id: str, *, principal: str = "w1", ttl: int = 30, epoch: int = 1
) -> Fence:
    """Claim ``task_id`` and insist that it worked; returns the fence."""
    result = store.claims.claim(task_id, principal=principal, epoch=epoch, ttl=ttl)
    assert result.verdict.outcome is Outcome.CLAIMED, result.verdict
    assert result.fence is not None
    return result.fence


def claim_result(
    store: Store, task_id: str, *, principal: str = "w1", ttl: int = 30, epoch: int = 1
) -> ClaimResult:
    """Claim ``task_id`` and return whatever came back."""
    return store.claims.claim(task_id, principal=principal, epoch=epoch, ttl=ttl)


def commit(
    store: Store,
    fence: Fence,
    *,
    principal: str = "w1",
    result: bytes = RESULT,
    input_digest: str | None = None,
) -> CommitResult:
    """Commit ``result`` for ``fence``, on the input the claim handed out (unless given)."""
    if input_digest is None:
        attempt = next(
            a for a in store.tasks.attempts(fence.task_id) if a.attempt_id == fence.attempt_id
        )
        input_digest = attempt.input_digest
    return store.acceptance.commit(
        fence,
        principal=principal,
        input_digest=input_digest,
        result_digest=digest_of(result),
        result=result,
        result_ref="",
    )


def writes_between(store: Store, start: int, end: int) -> list[WatchEvent]:
    """Every change under the store's prefix in revisions ``start`` to ``end``, from a watch."""
    seen: list[WatchEvent] = []
    lock = threading.Lock()

    def on_events(events: list[WatchEvent]) -> None:
        with lock:
            seen.extend(events)

    watch = store.ctx.kv.watch_prefix(
        store.ctx.keys.prefix + "/",
        start_revision=start,
        on_events=on_events,
        on_compacted=lambda: None,
    )
    try:
        eventually(lambda: any(e.mod_revision >= end for e in seen), timeout=10)
    finally:
        watch.close()
    return [e for e in seen if e.mod_revision <= end]


def raw(etcd_client: Any, key: str) -> Any:
    """The etcd3 metadata of ``key`` (create/mod revision, lease), or None if absent."""
    _, meta = etcd_client.get(key)
    return meta


def under(etcd_client: Any, prefix: str) -> dict[str, tuple[bytes, int]]:
    """Every key under ``prefix`` with its value and mod_revision."""
    return {
        meta.key.decode(): (value, meta.mod_revision)
        for value, meta in etcd_client.get_prefix(prefix)
    }


def snapshot(store: Store, etcd_client: Any) -> dict[str, tuple[bytes, int]]:
    """The whole keyspace of ``store`` (to assert that a refused call wrote nothing)."""
    return under(etcd_client, store.ctx.keys.prefix + "/")


def events(store: Store, etcd_client: Any, task_id: str) -> list[EventRecord]:
    """The task's transition events, in transition order."""
    found = under(etcd_client, store.ctx.keys.events_prefix(task_id))
    return [decode(EventRecord, found[key][0]) for key in sorted(found)]


def results(store: Store, etcd_client: Any) -> list[ResultRecord]:
    """Every canonical result under {prefix}/results/."""
    found = under(etcd_client, store.ctx.keys.prefix + "/results/")
    return [decode(ResultRecord, value) for value, _ in found.values()]


def wait_claim_gone(store: Store, etcd_client: Any, task_id: str) -> None:
    """Wait until the claim key's lease expired (etcd deleted the key)."""
    key = store.ctx.keys.claim(task_id)
    eventually(
        lambda: raw(etcd_client, key) is None, timeout=15, message=f"claim key {key} did not expire"
    )


def in_one_revision(store: Store, actions: Sequence[Callable[[], object]]) -> None:
    """Run ``actions`` (each a single-txn store call) so that their txns share one etcd
    revision, as group commit makes concurrent calls of one replica do under load: the store's
    batcher is swapped for one whose first round trip (a blocker) is held while they queue."""
    kv = store.ctx.kv
    held, holding = threading.Event(), threading.Event()
    rounds = [0]

    def send(request: Any) -> Any:
        rounds[0] += 1
        if rounds[0] == 1:
            holding.set()
            held.wait(10)
        return kv._send_txn(request)

    original = kv._batcher
    kv._batcher = batcher = GroupCommit(send, max_in_flight=1)
    try:
        blocker = threading.Thread(
            target=lambda: kv.txn([], [put(store.ctx.keys.prefix + "/test-blocker", b"")])
        )
        blocker.start()
        assert holding.wait(5)
        workers = [threading.Thread(target=action) for action in actions]
        for worker in workers:
            worker.start()
        eventually(lambda: len(batcher._queue) == len(actions), timeout=10)
        held.set()
        for thread in [blocker, *workers]:
            thread.join(10)
        assert rounds[0] == 2, f"the actions took {rounds[0] - 1} round trips, not one"
    finally:
        kv._batcher = original


def write_in_txns(store: Store, ops: Sequence[Any], per_txn: int = 100) -> None:
    """``ops`` written straight into etcd, ``per_txn`` a txn (below etcd's 128)."""
    for start in range(0, len(ops), per_txn):
        store.ctx.kv.txn([], ops[start : start + per_txn])


def past_attempts(
    store: Store,
    task: TaskRecord,
    count: int,
    *,
    attempt_id: Callable[[int], str] = new_attempt_id,
    checkpoint: bytes = b"",
) -> None:
    """``count`` released attempts written straight into etcd, as that many claim/release
    cycles would have (thousands of real cycles take minutes), counted on the task record."""
    keys = store.ctx.keys
    records = [
        AttemptRecord(
            task_id=task.task_id,
            attempt_id=attempt_id(n),
            attempt=n,
            owner_id="w",
            revision=1,
            input_digest=task.input_digest,
            scheduler_epoch=1,
            ttl=30,
            started_at=float(n),
            claim_generation=n,
            end=AttemptEnd.RELEASED,
            ended_at=float(n) + 0.5,
            checkpoint=checkpoint,
        )
        for n in range(1, count + 1)
    ]
    write_in_txns(store, [put(keys.attempt(r.task_id, r.attempt_id), encode(r)) for r in records])
    record = dataclasses.replace(task, attempt=count)
    store.ctx.kv.txn([], [put(keys.task(task.task_id), encode(record))])


REFUSED_FOR = 2.0
"""Seconds a test watches a refused replica do nothing: several passes of a loop that, admitted,
acts within one."""


def refuse_by_version(store: Store) -> None:
    """Raise the minimum coordinator version past this one; return once ``store``'s loops see
    the record refuse them (store/control/versions.py ``Standing``)."""
    VersionStore(store.ctx, own_version="99.0").set_minimums(min_coordinator_version="99.0")
    eventually(lambda: not store.ctx.admitted(), timeout=10, message="still admitted")


def admit_by_version(store: Store) -> None:
    """Lower the minimum coordinator version again (``allow_lower``)."""
    VersionStore(store.ctx).set_minimums(min_coordinator_version="0", allow_lower=True)
