"""ListClaims: the live claims a page at a time, each with its lease as etcd reports it.

The claimed index (``{p}/claimed/{task_id}``, value: the task's queue) lists the CLAIMED tasks
in id order and carries the queue, so a queue filter costs no task reads; the claim keys and
task records of a page are then read together, and the page's leases are asked about all at
once (domain/live_claims.py turns etcd's answers into times). Reads only: the renewal path
stays as it is (a keepalive, and a write only when the progress marker moves).
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.live_claims import LiveClaim, lease_view
from coordinator.domain.records import ClaimRecord, TaskRecord
from coordinator.domain.states import TaskState
from coordinator.store.context import StoreContext, claim_from_kv, task_from_kv
from coordinator.store.etcd.ops import KV, get
from coordinator.store.lifecycle.task_list import VALUES_PER_READ

MAX_SCANNED = 1000
"""Claimed-index keys one call reads at most: a queue filter among many claims of other queues
answers a short page (with a token) rather than reading the whole index."""
# Two reads per claim; etcd refuses a txn of more than 128 operations by default.
# Claims read at once: each with its task record, which holds the task's input (VALUES_PER_READ:
# at 50, a page of claimed tasks with maximal inputs was a 17 MiB read, past the message limit).
_CLAIMS_PER_READ = VALUES_PER_READ


@dataclass(frozen=True)
class ClaimsPage:
    """One page of live claims, the token of the next ("" after the last), and the store
    clock's time just before the leases were read."""

    claims: list[LiveClaim]
    next_page_token: str
    read_at: float


class LiveClaims:
    """The read behind ListClaims."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def page(self, *, queue: str = "", page_size: int, page_token: str = "") -> ClaimsPage:
        """Live claims after ``page_token`` (a task id), of ``queue`` if set, in id order."""
        task_ids, token = self._claimed(queue, page_size, page_token)
        held = self._held(task_ids)
        read_at = self._ctx.clock.now()
        readings = self._ctx.kv.lease_readings([kv.lease for _, _, kv in held])
        claims = [
            LiveClaim(task, claim, lease_view(got, read_at=read_at, claimed_at=claim.claimed_at))
            for (task, claim, _), got in zip(held, readings, strict=True)
            if got is not None  # expired since the read: no longer live
        ]
        return ClaimsPage(claims, token, read_at)

    def _claimed(self, queue: str, page_size: int, page_token: str) -> tuple[list[str], str]:
        """Up to ``page_size`` claimed task ids of ``queue`` after ``page_token``, and the next
        token: the last id taken when the page is full, the last id read when the scan bound
        stopped it first, "" at the end of the index."""
        kv, prefix = self._ctx.kv, self._ctx.keys.claimed_prefix
        start = prefix + page_token + "\0" if page_token else prefix
        end = kv.prefix_end(prefix)
        found: list[str] = []
        scanned = 0
        while True:
            limit = min(page_size, MAX_SCANNED - scanned)
            page, _ = kv.range_page(start, end, limit=limit)
            for item in page:
                if not queue or item.value.decode() == queue:
                    found.append(item.key.removeprefix(prefix))
                    if len(found) == page_size:
                        return found, found[-1]
            scanned += len(page)
            if len(page) < limit:
                return found, ""
            if scanned >= MAX_SCANNED:
                return found, page[-1].key.removeprefix(prefix)
            start = page[-1].key + "\0"

    def _held(self, task_ids: list[str]) -> list[tuple[TaskRecord, ClaimRecord, KV]]:
        """The task record and claim key of each id that is still CLAIMED with a live claim
        key of its current attempt (each batch read at one revision)."""
        keys, held = self._ctx.keys, []
        for first in range(0, len(task_ids), _CLAIMS_PER_READ):
            batch = task_ids[first : first + _CLAIMS_PER_READ]
            snap = self._ctx.kv.read(
                *(op for t in batch for op in (get(keys.task(t)), get(keys.claim(t))))
            )
            for index in range(len(batch)):
                task_kv, claim_kv = snap.range_one(2 * index), snap.range_one(2 * index + 1)
                if task_kv is None or claim_kv is None:
                    continue  # ended, or its lease expired and the reclaimer has not run yet
                task, claim = task_from_kv(task_kv), claim_from_kv(claim_kv)
                if task.state is TaskState.CLAIMED and claim.attempt_id == task.attempt_id:
                    held.append((task, claim, claim_kv))
        return held
