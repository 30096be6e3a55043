"""Helpers for the lifecycle tests: tasks driven through their states with the store, raw
keyspace reads, and caller metadata for the gRPC tests."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coordinator.domain.decisions import ClaimLimits, Fence
from coordinator.domain.digests import digest_of
from coordinator.domain.records import EventRecord, TaskRecord, decode
from coordinator.domain.states import Outcome, TaskState
from coordinator.server.identity import PRINCIPAL_METADATA_KEY, ROLES_METADATA_KEY
from coordinator.store import Store, TaskSpec
from tests.helpers import RETRY_AT_ONCE

LIMITS = ClaimLimits(
    min_ttl=1, max_ttl=30, max_claim_duration=600.0, stall_timeout=300.0, retry=RETRY_AT_ONCE
)
NO_SCAN = 3600.0
RESULT = b"the report"


def who(principal: str, roles: str = "", key: str = "") -> tuple[tuple[str, str], ...]:
    """gRPC metadata naming the caller (insecure mode), its roles and an idempotency key."""
    metadata = [(PRINCIPAL_METADATA_KEY, principal)]
    if roles:
        metadata.append((ROLES_METADATA_KEY, roles))
    if key:
        metadata.append(("idempotency-key", key))
    return tuple(metadata)


def create(
    store: Store,
    task_id: str,
    *,
    review: bool = False,
    depends_on: tuple[str, ...] = (),
    root: str = "",
    parent: str = "",
    thread: str = "",
    queue: str = "default",
    by: str = "pm",
) -> TaskRecord:
    """Create a task through the store."""
    spec = TaskSpec(
        task_id=task_id,
        queue=queue,
        input=f"input of {task_id}".encode(),
        requires_review=review,
        depends_on=depends_on,
        root_task_id=root,
        parent_task_id=parent,
        thread_key=thread,
    )
    return store.tasks.create(spec, by=by)


def claim(store: Store, task_id: str, principal: str = "w1") -> Fence:
    """Claim and insist it worked."""
    result = store.claims.claim(task_id, principal=principal, epoch=store.admin.epoch(), ttl=30)
    assert result.verdict.outcome is Outcome.CLAIMED, result.verdict
    assert result.fence is not None
    return result.fence


def commit(store: Store, fence: Fence, principal: str = "w1", result: bytes = RESULT) -> Outcome:
    """Commit ``result`` on the claimed input; returns the outcome."""
    task = store.tasks.get(fence.task_id)
    done = store.acceptance.commit(
        fence,
        principal=principal,
        input_digest=task.input_digest,
        result_digest=digest_of(result),
        result=result,
        result_ref="",
    )
    return done.verdict.outcome


def finish(store: Store, task_id: str, principal: str = "w1") -> TaskRecord:
    """Claim and commit: DONE (or REVIEW for a task that requires review)."""
    assert commit(store, claim(store, task_id, principal), principal) is Outcome.COMMITTED
    task = store.tasks.get(task_id)
    assert task.state in (TaskState.DONE, TaskState.REVIEW)
    return task


def snapshot(store: Store, etcd_client: Any) -> dict[str, tuple[bytes, int]]:
    """Every key of the store's keyspace with value and mod_revision."""
    return {
        meta.key.decode(): (value, meta.mod_revision)
        for value, meta in etcd_client.get_prefix(store.ctx.keys.prefix + "/")
    }


def events(store: Store, etcd_client: Any, task_id: str) -> list[EventRecord]:
    """The task's stored events in transition order."""
    found = {
        meta.key.decode(): value
        for value, meta in etcd_client.get_prefix(store.ctx.keys.events_prefix(task_id))
    }
    return [decode(EventRecord, found[key]) for key in sorted(found)]


WRITERS = 16
"""Threads that write at once when a test wants group commit to share revisions."""


def create_concurrently(store: Store, names: list[str], *, queue: str = "burst") -> None:
    """Create ``names`` in ``queue`` from WRITERS threads at once, so group commit puts
    several creations in one etcd revision."""
    start = threading.Barrier(WRITERS)

    def write(chunk: list[str]) -> None:
        start.wait()
        for name in chunk:
            create(store, name, queue=queue)

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(write, [names[i::WRITERS] for i in range(WRITERS)]))
