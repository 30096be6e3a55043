"""The checks themselves: one pure pass over a snapshot (see the package docstring). Per task:
its primary evidence (primary.py), its indexes and results (here), its edges (edges.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from coordinator.doctor.due_indexes import check_due_indexes, check_due_orphans
from coordinator.doctor.edges import check_edges
from coordinator.doctor.effects import check_effects
from coordinator.doctor.findings import (
    LAGGING,
    Finding,
    Guard,
    Problem,
    Repair,
    RepairWrite,
    Snapshot,
)
from coordinator.doctor.marks import check_marks
from coordinator.doctor.orphans import check_orphans
from coordinator.doctor.parsed import Parsed, decode_or_report, identity_keys, parse
from coordinator.doctor.primary import check_primary
from coordinator.doctor.retention import check_retention
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import (
    ResultRecord,
    TaskRecord,
)
from coordinator.domain.retention import DEFAULT_RETENTION
from coordinator.domain.states import TaskState
from coordinator.store.etcd import KV

T = TypeVar("T")


def check(snap: Snapshot, keys: Keyspace, *, retention: float = DEFAULT_RETENTION) -> list[Finding]:
    """Every disagreement in ``snap``, grouped by task in id order (``retention``: what a
    terminal task missing from the prune index is scheduled with)."""
    parsed = parse(snap, keys)
    findings = list(parsed.findings)
    for task_id in sorted(parsed.tasks):
        findings += _check_task(parsed, keys, task_id)
    findings += check_orphans(parsed, keys)
    findings += check_due_orphans(parsed, keys)
    findings += check_marks(parsed, keys)
    findings += check_effects(parsed, keys)
    findings += check_retention(parsed, keys, retention=retention)
    return findings


def confirm(first: Iterable[Finding], later: Iterable[Finding]) -> list[Finding]:
    """``first`` without the lagging findings that did not persist, unchanged, into ``later``
    (a snapshot taken a reclaim window after)."""
    persisting = {(f.problem, f.task_id, f.state_version) for f in later if f.problem in LAGGING}
    return [
        f
        for f in first
        if f.problem not in LAGGING or (f.problem, f.task_id, f.state_version) in persisting
    ]


def _check_task(parsed: Parsed, keys: Keyspace, task_id: str) -> list[Finding]:
    kv, task = parsed.tasks[task_id]
    out: list[Finding] = []
    conflict = check_primary(parsed, task, kv, out)
    # Derived keys are repaired only when the primary evidence agrees with the record.
    fixable = not conflict
    _check_ready(parsed, keys, task, kv, out, fixable)
    for state, name, missing, orphan in _STATE_INDEXES:
        present = getattr(parsed, name).get(task_id)
        key = getattr(keys, name)(task_id)
        _check_index(out, task, kv, fixable, state, present, key, (missing, orphan))
    out += check_due_indexes(parsed, keys, task, kv, fixable)
    _check_results(parsed, keys, task, out)
    check_edges(parsed, keys, task, kv, out)
    _check_identity(parsed, keys, task, kv, out)
    return out


def _check_ready(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, out: list[Finding], fixable: bool
) -> None:
    tid = task.task_id
    expected = (
        keys.ready(task.queue, task.priority, task.ready_seq, tid)
        if task.state is TaskState.READY
        else None
    )
    present = {r.key: r for r in parsed.ready.get(tid, [])}
    if expected is not None and expected not in present:
        out.append(
            Finding(
                Problem.READY_KEY_MISSING,
                tid,
                f"task {tid} is READY but missing from the ready index: no worker can ClaimNext it",
                (kv.key, expected),
                _repair(
                    fixable,
                    f"add ready key {expected}",
                    [Guard(kv.key, kv.mod_revision), Guard(expected, 0)],
                    [RepairWrite(expected, b"")],
                ),
            )
        )
    for key, ready_kv in present.items():
        if key == expected:
            continue
        where = (
            f"{task.state.name} but also listed in the ready index (in two places)"
            if task.state is not TaskState.READY
            else "READY but listed under a stale ready key"
        )
        out.append(
            Finding(
                Problem.READY_KEY_ORPHAN,
                tid,
                f"task {tid} is {where}: {key}",
                (kv.key, key),
                _repair(
                    fixable,
                    f"delete ready key {key}",
                    [Guard(kv.key, kv.mod_revision), Guard(key, ready_kv.mod_revision)],
                    [RepairWrite(key, None)],
                ),
            )
        )


# The per-task index keys that exist exactly while a task is in one state.
_STATE_INDEXES = (
    (TaskState.CLAIMED, "claimed", Problem.CLAIMED_INDEX_MISSING, Problem.CLAIMED_INDEX_ORPHAN),
    (TaskState.WAITING, "waiting", Problem.WAITING_INDEX_MISSING, Problem.WAITING_INDEX_ORPHAN),
)


def _check_index(
    out: list[Finding],
    task: TaskRecord,
    kv: KV,
    fixable: bool,
    state: TaskState,
    present: KV | None,
    key: str,
    problems: tuple[Problem, Problem],
) -> None:
    """A per-task index key that exists exactly while the task is in ``state``."""
    tid, (missing, orphan) = task.task_id, problems
    name = f"{state.name.lower()} index"
    if task.state is state and present is None:
        out.append(
            Finding(
                missing,
                tid,
                f"task {tid} is {state.name} but has no {name} key {key}",
                (kv.key, key),
                _repair(
                    fixable,
                    f"add {name} key {key}",
                    [Guard(kv.key, kv.mod_revision), Guard(key, 0)],
                    [RepairWrite(key, _index_value(task, state))],
                ),
            )
        )
    elif task.state is not state and present is not None:
        out.append(
            Finding(
                orphan,
                tid,
                f"task {tid} is {task.state.name} but has a {name} key {key}",
                (kv.key, key),
                _repair(
                    fixable,
                    f"delete {name} key {key}",
                    [Guard(kv.key, kv.mod_revision), Guard(key, present.mod_revision)],
                    [RepairWrite(key, None)],
                ),
            )
        )


def _index_value(task: TaskRecord, state: TaskState) -> bytes:
    """What store/transition.py writes in a per-task index key: the claimed index carries the
    task's queue (the per-queue claimed gauge counts it), the others nothing."""
    return task.queue.encode() if state is TaskState.CLAIMED else b""


def _check_results(parsed: Parsed, keys: Keyspace, task: TaskRecord, out: list[Finding]) -> None:
    tid = task.task_id
    current: ResultRecord | None = None
    for result_kv in parsed.results.get(tid, []):
        revision = int(result_kv.key.rsplit("/", 1)[1])
        if revision > task.revision:
            out.append(
                Finding(
                    Problem.RESULT_UNEXPECTED,
                    tid,
                    f"{tid} has a canonical result for revision {revision}, beyond its revision "
                    f"{task.revision}",
                    (result_kv.key,),
                )
            )
        elif revision == task.revision:
            current = decode_or_report(parsed, ResultRecord, result_kv, tid)
    committed = task.state in (TaskState.DONE, TaskState.REVIEW)
    if committed and current is None:
        out.append(
            Finding(
                Problem.RESULT_MISSING,
                tid,
                f"task {tid} is {task.state.name} but revision {task.revision} has no canonical "
                "result",
                (keys.task(tid), keys.result(tid, task.revision)),
            )
        )
    elif committed and current is not None and current.commit_id != task.result_commit_id:
        out.append(
            Finding(
                Problem.RESULT_MISMATCH,
                tid,
                f"task {tid} names commit {task.result_commit_id!r}, its canonical result is "
                f"{current.commit_id!r}",
                (keys.task(tid), keys.result(tid, task.revision)),
            )
        )
    elif current is not None and task.state not in (
        TaskState.DONE,
        TaskState.REVIEW,
        TaskState.CANCELLED,
        TaskState.FAILED,
    ):
        out.append(
            Finding(
                Problem.RESULT_UNEXPECTED,
                tid,
                f"task {tid} is {task.state.name} yet revision {task.revision} already has a "
                f"canonical result ({current.commit_id})",
                (keys.result(tid, task.revision),),
            )
        )


def _check_identity(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, out: list[Finding]
) -> None:
    tid = task.task_id
    for key in identity_keys(keys, task):
        if key not in parsed.identity:
            out.append(
                Finding(
                    Problem.IDENTITY_INDEX_MISSING,
                    tid,
                    f"task {tid} is missing from the lineage index {key}: ListTasks by lineage "
                    "would not show it",
                    (kv.key, key),
                    Repair(
                        f"add identity index key {key}",
                        (Guard(kv.key, kv.mod_revision), Guard(key, 0)),
                        (RepairWrite(key, b""),),
                    ),
                )
            )


def _repair(
    fixable: bool, action: str, guards: list[Guard], writes: list[RepairWrite]
) -> Repair | None:
    return Repair(action, tuple(guards), tuple(writes)) if fixable else None
