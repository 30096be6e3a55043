"""What one claim -> commit cycle writes to etcd, counted by a watch on the store's prefix.

The count is the hot path's etcd cost (docs/architecture.md lists each key and why it exists):
a change that adds a key or a revision to the cycle fails here and must say why in that table.
A keyspace at schema 3 keeps the attempt in the task record (11 keys); one still at schema 2
writes it to a key of its own at the claim and again at the commit (13).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from etcd3 import etcdrpc

from coordinator.domain.states import Outcome
from coordinator.domain.versions import VersionRecord
from coordinator.store import Store
from tests.store.support import StoreFactory, claim, commit, create, raw, writes_between

# (kind of key, deleted) per revision, the kind being the key's first segment under the prefix.
CLAIM_WRITES = sorted(
    [
        ("tasks", False),  # the task record, CLAIMED
        ("ready", True),  # out of the ready index
        ("claimed", False),  # into the claimed index (per-queue counts without records)
        ("claims", False),  # the claim key on the claim's lease: the fence's liveness
        ("events", False),  # the event log's CLAIM entry
    ]
)
COMMIT_WRITES = sorted(
    [
        ("tasks", False),  # the task record, COMMITTED
        ("claimed", True),  # out of the claimed index
        ("claims", True),  # the claim key, so the lease is empty and can be reused
        ("results", False),  # the canonical result
        ("events", False),  # the event log's COMMIT entry
        ("prune-due", False),  # the prune index: when the finished task may be pruned
    ]
)


def _kind(store: Store, key: str) -> str:
    return key.removeprefix(store.ctx.keys.prefix + "/").split("/", 1)[0]


# Schema 2: the attempt record, running (claim) and ended COMMITTED (commit).
ATTEMPT_KEY = [("attempts", False)]


@pytest.fixture
def at_schema_2(make_store: StoreFactory, etcd_client: Any, prefix: str) -> Store:
    """A store on a keyspace still at schema 2."""
    etcd_client.put(f"{prefix}/meta/versions", VersionRecord(schema_version=2).encode())
    return make_store()


def test_a_claim_commit_cycle_writes_11_keys_in_2_revisions(store: Store, etcd_client: Any) -> None:
    assert _cycle(store, etcd_client) == (CLAIM_WRITES, COMMIT_WRITES)
    assert len(CLAIM_WRITES) + len(COMMIT_WRITES) == 11


def test_at_schema_2_the_cycle_writes_the_attempt_key_too(
    at_schema_2: Store, etcd_client: Any
) -> None:
    claim_writes, commit_writes = _cycle(at_schema_2, etcd_client)
    assert claim_writes == sorted(CLAIM_WRITES + ATTEMPT_KEY)
    assert commit_writes == sorted(COMMIT_WRITES + ATTEMPT_KEY)


def _cycle(store: Store, etcd_client: Any) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    """The (kind, deleted) keys of one claim's revision and of its commit's, sorted."""
    create(store, "t", queue="q")
    start = raw(etcd_client, store.ctx.keys.task("t")).mod_revision
    claimed = store.claims.claim_next("q", principal="w1", epoch=1, ttl=30)
    assert claimed.verdict.outcome is Outcome.CLAIMED and claimed.fence is not None
    assert commit(store, claimed.fence).verdict.outcome is Outcome.COMMITTED
    end = raw(etcd_client, store.ctx.keys.task("t")).mod_revision
    assert (claimed.fence.claim_generation, end) == (start + 1, start + 2)

    by_revision: dict[int, list[tuple[str, bool]]] = {start + 1: [], end: []}
    for event in writes_between(store, start + 1, end):
        by_revision[event.mod_revision].append((_kind(store, event.key), event.deleted))
    return sorted(by_revision[start + 1]), sorted(by_revision[end])


def _task_compares(
    store: Store, monkeypatch: pytest.MonkeyPatch, task_id: str, action: Callable[[], object]
) -> list[list[tuple[int, int]]]:
    """The compares on ``task_id``'s key of every conditional txn ``action`` sends (reads
    compare nothing), one list per txn."""
    kv, task_key = store.ctx.kv, store.ctx.keys.task(task_id).encode()
    sent: list[list[tuple[int, int]]] = []
    original = kv.txn

    def txn(compare: Any, *args: Any, **kwargs: Any) -> Any:
        compares = list(compare)
        if compares:
            sent.append([(c.target, c.mod_revision) for c in compares if c.key == task_key])
        return original(compares, *args, **kwargs)

    monkeypatch.setattr(kv, "txn", txn)
    action()
    monkeypatch.undo()
    return sent


def test_commit_and_release_compare_the_task_revision_once_the_fences_compare(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    for task_id in ("c", "r"):
        create(store, task_id)
    fence = claim(store, "c")
    sent = _task_compares(store, monkeypatch, "c", lambda: commit(store, fence))
    assert sent == [[(etcdrpc.Compare.MOD, fence.claim_generation)]]

    fence = claim(store, "r")
    release = lambda: store.acceptance.release(fence, principal="w1", reason="")  # noqa: E731
    sent = _task_compares(store, monkeypatch, "r", release)
    assert sent == [[(etcdrpc.Compare.MOD, fence.claim_generation)]]
