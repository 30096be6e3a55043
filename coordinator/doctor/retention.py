"""Retention findings: records a half-done prune left behind, terminal tasks the pruner cannot
find, prune-index keys of missing tasks, effects missing from their task's index.

A prune deletes the task key, its prune-index key, its attempts, events, results and staged
results in one txn (store/retention/prune_ops.py); only a task with more effects and jobs than one
txn holds goes on in pages, so a crash can leave effect and job records (and their index
entries) of a task whose tombstone says it was archived. Those, and anything written after the prune
(a late StageResult), are ``records-of-pruned-task``: archived already, so deleting them is
safe; ``coordinator doctor --repair-pruned`` does it. Tasks that finished before retention
existed have no prune-index key: ``--repair`` schedules them ``--retention`` after they finished.
Effects recorded before the per-task effect index existed get their index entry the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.doctor.findings import Finding, Guard, Problem, Repair, RepairWrite
from coordinator.doctor.parsed import Parsed
from coordinator.domain.effects import EffectRecord
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import decode
from coordinator.domain.retention import micros
from coordinator.domain.states import TERMINAL_STATES
from coordinator.store.etcd.ops import KV
from coordinator.store.retention.tombstones import tombstone_from_kv
from coordinator.store.retention_index import due_value

# Keys deleted per repair txn (etcd allows 128 operations, guards included).
_PER_REPAIR = 60


def check_retention(parsed: Parsed, keys: Keyspace, *, retention: float) -> list[Finding]:
    """Every retention disagreement in ``parsed``."""
    effects_of = _effects_by_task(parsed)
    return [
        *_tombstone_findings(parsed, keys, effects_of),
        *_unscheduled(parsed, keys, retention),
        *_prune_index_orphans(parsed, keys),
        *_unindexed_effects(parsed, keys, effects_of),
    ]


Effects = dict[str, list[tuple[KV, EffectRecord]]]


def _tombstone_findings(parsed: Parsed, keys: Keyspace, effects_of: Effects) -> list[Finding]:
    """A tombstone beside a live task, or with records the prune left behind."""
    out: list[Finding] = []
    for tid, tomb_kv in sorted(parsed.tombstones.items()):
        if tid in parsed.tasks:
            out.append(
                Finding(
                    Problem.TASK_AND_TOMBSTONE,
                    tid,
                    f"task {tid} exists and has a tombstone: its id was reused while the tombstone "
                    "should have refused it",
                    (keys.task(tid), tomb_kv.key),
                )
            )
            continue
        left = _leftovers(parsed, keys, tid, effects_of.get(tid, []))
        out += _leftover_findings(keys, tid, tomb_kv, left)
    return out


def _unscheduled(parsed: Parsed, keys: Keyspace, retention: float) -> list[Finding]:
    """Finished tasks missing from the prune index."""
    out: list[Finding] = []
    for tid, (kv, task) in sorted(parsed.tasks.items()):
        if task.state in TERMINAL_STATES and tid not in parsed.prune_due:
            due = keys.prune_due(micros(task.updated_at + retention), tid)
            out.append(
                Finding(
                    Problem.TERMINAL_NOT_SCHEDULED,
                    tid,
                    f"task {tid} is {task.state.name} but not in the prune index: it would "
                    "never be pruned (finished before retention existed?)",
                    (kv.key,),
                    Repair(
                        f"schedule its prune at {due}",
                        (Guard(kv.key, kv.mod_revision), Guard(due, 0)),
                        (RepairWrite(due, due_value(task)),),
                    )
                    if retention > 0
                    else None,
                )
            )
    return out


def _prune_index_orphans(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Prune-index keys of a task that does not exist."""
    out: list[Finding] = []
    for tid, due_kv in sorted(parsed.prune_due.items()):
        if tid not in parsed.tasks:
            out.append(
                Finding(
                    Problem.PRUNE_INDEX_ORPHAN,
                    tid,
                    f"prune-index key {due_kv.key} names {tid}, which has no task record",
                    (due_kv.key,),
                    Repair(
                        f"delete {due_kv.key}",
                        (Guard(due_kv.key, due_kv.mod_revision), Guard(keys.task(tid), 0)),
                        (RepairWrite(due_kv.key, None),),
                    ),
                )
            )
    return out


def _unindexed_effects(parsed: Parsed, keys: Keyspace, effects_of: Effects) -> list[Finding]:
    """Effects of a live task missing from its task's effect index."""
    out: list[Finding] = []
    for tid, effects in sorted(effects_of.items()):
        if tid not in parsed.tasks:
            continue
        for effect_kv, effect in effects:
            index = keys.task_effect(tid, effect.effect_id)
            if (tid, effect.effect_id) not in parsed.task_effects:
                out.append(
                    Finding(
                        Problem.TASK_EFFECT_INDEX_MISSING,
                        tid,
                        f"effect {effect.effect_id} of task {tid} is not in its task's effect "
                        "index: pruning the task would leave it behind",
                        (effect_kv.key, index),
                        Repair(
                            f"add {index}",
                            (Guard(effect_kv.key, effect_kv.mod_revision), Guard(index, 0)),
                            (RepairWrite(index, b""),),
                        ),
                    )
                )
    return out


def _effects_by_task(parsed: Parsed) -> Effects:
    found: Effects = {}
    for kv in parsed.effects.values():
        try:
            effect = decode(EffectRecord, kv.value)
        except Exception:  # doctor/effects.py reports undecodable effects
            continue
        found.setdefault(effect.task_id, []).append((kv, effect))
    return found


def _leftovers(
    parsed: Parsed, keys: Keyspace, tid: str, effects: Sequence[tuple[KV, EffectRecord]]
) -> list[KV]:
    """Every key still there of the pruned task ``tid``."""
    left: list[KV] = []
    for section in ("attempts", "results", "events", "staging", "jobs"):
        left += getattr(parsed, section).get(tid, [])
    for job_kv in parsed.jobs.get(tid, []):
        job_id = job_kv.key.rsplit("/", 1)[1]
        worker_kv = parsed.worker_jobs.get(job_id)
        if worker_kv is not None and worker_kv.value == tid.encode():
            left.append(worker_kv)
    left += [kv for (t, _), kv in parsed.task_effects.items() if t == tid]
    left += [kv for kv, _ in effects]
    if tid in parsed.deps:
        left.append(parsed.deps[tid])
    if left and tid in parsed.prune_pending:  # last: the marker of an unfinished prune
        left.append(parsed.prune_pending[tid])
    return left


def _leftover_findings(keys: Keyspace, tid: str, tomb_kv: KV, left: list[KV]) -> list[Finding]:
    """One finding per page of leftovers, each repaired by one guarded txn."""
    out: list[Finding] = []
    for start in range(0, len(left), _PER_REPAIR):
        page = left[start : start + _PER_REPAIR]
        guards = (
            Guard(tomb_kv.key, tomb_kv.mod_revision),
            Guard(keys.task(tid), 0),
            *(Guard(kv.key, kv.mod_revision) for kv in page),
        )
        out.append(
            Finding(
                Problem.PRUNE_LEFTOVER,
                tid,
                f"{len(page)} record(s) of {tid}, which was pruned (archived to "
                f"{_archive_of(tomb_kv)}): a prune stopped half-way, or a write came after it",
                tuple(kv.key for kv in page),
                Repair(
                    f"delete {len(page)} record(s) of pruned task {tid}",
                    guards,
                    tuple(RepairWrite(kv.key, None) for kv in page),
                ),
            )
        )
    return out


def _archive_of(tomb_kv: KV) -> str:
    try:
        return tombstone_from_kv(tomb_kv).archive
    except (ValueError, TypeError, KeyError):
        return "(unreadable tombstone)"
