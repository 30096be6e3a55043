"""The txns that remove one archived task: the prune txn, and the pages that finish a large one.

The prune txn is a CAS on the task key's mod_revision as read for the archive (a task that moved
since - it cannot leave a terminal state, but an edit or a second pruner can win - is never
pruned), plus compares that no uncertain effect, open reconciliation or new dependent edge
appeared. It deletes the task key and its prune-index key, writes the tombstone, and deletes
everything else of the task: whole ranges where the keys are the task's own (attempts, events,
results, staged results), single keys otherwise (edges, identity index, effects, job index).

etcd allows 128 operations per txn. The ranges, edges (at most 50) and identity keys always fit;
effects and jobs are one key each (plus their index), so a task with many of them cannot go in
one txn. Then the prune txn also writes ``{p}/prune-pending/{task}``, and ``finish_pages``
deletes the rest, keeping each record's index entry until the record itself is gone, so a crash
between pages leaves only what the next pass (or ``coordinator doctor --repair``) can still find.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.domain.jobs import JobRecord
from coordinator.domain.records import decode, encode
from coordinator.domain.retention import Tombstone, micros
from coordinator.store.context import StoreContext
from coordinator.store.etcd.ops import (
    KV,
    Compare,
    RequestOp,
    delete,
    delete_prefix,
    mod_revision_is,
    put,
    range_empty,
    range_unchanged_since,
)
from coordinator.store.retention.history import TaskHistory

MAX_OPS = 128
"""etcd's default ``--max-txn-ops``."""


@dataclass(frozen=True)
class PruneTxn:
    """The prune txn of one task; ``pending`` when more pages must follow it."""

    compares: list[Compare]
    ops: list[RequestOp]
    tombstone: Tombstone
    pending: bool


def prune_txn(
    ctx: StoreContext, history: TaskHistory, due_key: str, *, archive: str, now: float
) -> PruneTxn:
    """The txn that removes ``history``'s task after its archive to ``archive`` was confirmed."""
    keys, task_id = ctx.keys, history.task_id
    tombstone = Tombstone.of(history.task, pruned_at=now, archive=archive)
    compares = [
        mod_revision_is(keys.task(task_id), history.task_kv.mod_revision),
        range_empty(keys.open_effects_prefix(task_id)),
        range_empty(keys.reconcile_prefix(task_id)),
        # A new WAITING dependent would have to write its reverse edge here.
        range_unchanged_since(keys.dependents_prefix(task_id), history.revision),
    ]
    ops = [
        delete(keys.task(task_id)),
        delete(keys.input(task_id)),  # schema 2's input key (nothing to delete under schema 1)
        delete(due_key),
        put(keys.tombstone(task_id), encode(tombstone)),
        put(keys.tombstone_due(micros(now + ctx.retention.tombstone), task_id), b""),
        delete_prefix(keys.attempts_prefix(task_id)),
        delete_prefix(keys.events_prefix(task_id)),
        delete_prefix(keys.results_of(task_id)),
        delete_prefix(f"{keys.staging_prefix}{task_id}/"),
        *(delete(k) for k in history.identity_keys(ctx)),
    ]
    # The task's own edges; the edges of its dependents (dependents/{task}/...) are theirs.
    if history.deps is not None:
        ops.append(delete(keys.deps(task_id)))
    ops += [delete(keys.dependent(u, task_id)) for u in history.task.depends_on]
    leaves = leaf_deletes(ctx, task_id, history.effect_index, history.jobs)
    room = MAX_OPS - len(ops) - 1  # one left for the pending marker
    if len(leaves) <= room + 1:
        return PruneTxn(compares, ops + leaves, tombstone, pending=False)
    ops += leaves[:room]
    ops.append(put(keys.prune_pending(task_id), archive.encode()))
    return PruneTxn(compares, ops, tombstone, pending=True)


def leaf_deletes(
    ctx: StoreContext,
    task_id: str,
    effect_index: Sequence[str],
    jobs: Sequence[KV],
    *,
    ranges: bool = True,
) -> list[RequestOp]:
    """Deletes of the task's effects (``effect_index``: its per-task effect index keys) and
    managed jobs (their records), each record before its index entry, ending (``ranges``: when
    these are all of them) with the two index ranges: any prefix of this list leaves the rest
    findable."""
    keys = ctx.keys
    ops: list[RequestOp] = []
    for effect_key in effect_index:
        ops += [delete(keys.effect(effect_key.rsplit("/", 1)[1])), delete(effect_key)]
    for job_kv in jobs:
        job = decode(JobRecord, job_kv.value)
        ops += [delete(keys.worker_job(job.worker_id, job.job_id)), delete(job_kv.key)]
    if not ranges:
        return ops
    ops += [
        delete_prefix(keys.task_effects_prefix(task_id)),
        delete_prefix(keys.jobs_prefix(task_id)),
    ]
    return ops


def finish_pages(
    ctx: StoreContext,
    task_id: str,
    effect_index: Sequence[str],
    jobs: Sequence[KV],
    *,
    last: bool = True,
) -> list[list[RequestOp]]:
    """The pages that finish an unfinished prune (from what is left of the task, whose key is
    already gone); when ``effect_index`` and ``jobs`` are the ``last`` of it, the last page
    deletes the index ranges and the pending marker."""
    leaves = leaf_deletes(ctx, task_id, effect_index, jobs, ranges=last)
    if last:
        leaves.append(delete(ctx.keys.prune_pending(task_id)))
    return [leaves[i : i + MAX_OPS] for i in range(0, len(leaves), MAX_OPS)]
