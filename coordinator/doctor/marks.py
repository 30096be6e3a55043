"""The mark indexes of WAITING tasks: blocked (``{p}/blocked/{id}``: an upstream is FAILED or
CANCELLED) and overdue (``{p}/overdue/{id}``: its schedule_to_close passed while it waited).

Each key exists exactly while the record says so (store/transition.py's ``blocked_key`` and
``overdue_key``) and carries the task's queue: the per-queue blocked and overdue counts are read
from it. A missing key hides a task from those counts, an orphan counts one that is not there;
either has one fix made from the record, guarded by it. Whether the record's mark itself is
right (its upstreams' states) is checks.py's ``blocked-mark-overdue``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from coordinator.doctor.findings import Finding, Guard, Problem, Repair, RepairWrite
from coordinator.doctor.parsed import Parsed
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord
from coordinator.store.etcd.ops import KV
from coordinator.store.transition import blocked_key, overdue_key


@dataclass(frozen=True)
class _Mark:
    """One mark index: its section in the keyspace, what the record says, its problems."""

    section: str
    expected: Callable[[Keyspace, TaskRecord], str | None]
    missing: Problem
    orphan: Problem


_MARKS = (
    _Mark("blocked", blocked_key, Problem.BLOCKED_INDEX_MISSING, Problem.BLOCKED_INDEX_ORPHAN),
    _Mark("overdue", overdue_key, Problem.OVERDUE_INDEX_MISSING, Problem.OVERDUE_INDEX_ORPHAN),
)


def check_marks(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Every mark-index key against its task record (a key of a missing task is an orphan)."""
    out: list[Finding] = []
    for mark in _MARKS:
        present: dict[str, KV] = getattr(parsed, mark.section)
        for tid, (kv, task) in sorted(parsed.tasks.items()):
            want = mark.expected(keys, task)
            if want is not None and tid not in present:
                out.append(_missing(mark, task, kv, want))
            elif want is None and tid in present:
                out.append(_orphan(mark, tid, present[tid], Guard(kv.key, kv.mod_revision)))
        for tid, index_kv in sorted(present.items()):
            if tid not in parsed.tasks:
                out.append(_orphan(mark, tid, index_kv, Guard(keys.task(tid), 0)))
    return out


def _missing(mark: _Mark, task: TaskRecord, kv: KV, want: str) -> Finding:
    tid = task.task_id
    return Finding(
        mark.missing,
        tid,
        f"task {tid} is WAITING and {mark.section} but has no {mark.section} key {want}: the "
        f"per-queue {mark.section} count misses it",
        (kv.key, want),
        Repair(
            f"add {mark.section} key {want}",
            (Guard(kv.key, kv.mod_revision), Guard(want, 0)),
            (RepairWrite(want, task.queue.encode()),),
        ),
    )


def _orphan(mark: _Mark, tid: str, index_kv: KV, guard: Guard) -> Finding:
    return Finding(
        mark.orphan,
        tid,
        f"{mark.section} key {index_kv.key} names task {tid}, which is not WAITING and "
        f"{mark.section} (or does not exist): the per-queue {mark.section} count is wrong",
        (index_kv.key,),
        Repair(
            f"delete {mark.section} key {index_kv.key}",
            (guard, Guard(index_kv.key, index_kv.mod_revision)),
            (RepairWrite(index_kv.key, None),),
        ),
    )
