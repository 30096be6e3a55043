"""The indexes sorted by time, against the task records: the delayed index (a DELAYED task's key
at its not_before, ``{p}/delayed/{due_ms}/{id}``) and the deadline index (a task's key at its
schedule_to_close deadline while it awaits a result, ``{p}/deadlines/{ms}/{id}``).

Both are derived keys, written by the transitions from the record (store/transition.py's
``delayed_key`` and ``deadline_key``), so each disagreement has one fix made from the record.
A missing or misdated key is not harmless: the promoter and the deadline pass read only the
range of their index up to now, so a DELAYED task without its key never becomes READY (or too
early, or too late, with a key at another time), and a task without its deadline key is never
timed out. An orphan key (of a task not DELAYED, terminal, without a deadline, or missing)
costs a record read on every pass, for ever.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from coordinator.doctor.findings import Finding, Guard, Problem, Repair, RepairWrite
from coordinator.doctor.parsed import Parsed
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import TaskRecord
from coordinator.store.etcd.ops import KV
from coordinator.store.transition import deadline_key, delayed_key


@dataclass(frozen=True)
class _Index:
    """One index sorted by time, as doctor checks it."""

    section: str  # the Parsed attribute that holds its keys by task id
    name: str
    expected: Callable[[Keyspace, TaskRecord], str | None]
    due: Callable[[TaskRecord], float]  # the record's time the key must carry
    broken: str  # what a task without its key misses
    problems: tuple[Problem, Problem, Problem]  # missing, mismatch, orphan


_INDEXES = (
    _Index(
        "delayed",
        "delayed",
        delayed_key,
        lambda task: task.not_before,
        "the promoter never makes it READY",
        (Problem.DELAYED_KEY_MISSING, Problem.DELAYED_KEY_MISMATCH, Problem.DELAYED_KEY_ORPHAN),
    ),
    _Index(
        "deadlines",
        "deadline",
        deadline_key,
        lambda task: task.deadline,
        "it is never timed out",
        (
            Problem.DEADLINE_KEY_MISSING,
            Problem.DEADLINE_KEY_MISMATCH,
            Problem.DEADLINE_KEY_ORPHAN,
        ),
    ),
)


def check_due_indexes(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, fixable: bool
) -> list[Finding]:
    """``task``'s keys in both indexes against its record (repaired only when ``fixable``: the
    record's primary evidence agrees with it)."""
    out: list[Finding] = []
    for index in _INDEXES:
        present = {p.key: p for p in getattr(parsed, index.section).get(task.task_id, [])}
        want = index.expected(keys, task)
        stale = [p for key, p in present.items() if key != want]
        if want is not None and want not in present:
            out.append(_missing(index, task, kv, want, stale, fixable))
            continue
        out += [_orphan(index, task, kv, p, want, fixable) for p in stale]
    return out


def check_due_orphans(parsed: Parsed, keys: Keyspace) -> list[Finding]:
    """Keys of both indexes that name a task that does not exist (deleted, guarded by its
    absence)."""
    out: list[Finding] = []
    for index in _INDEXES:
        for tid, kvs in sorted(getattr(parsed, index.section).items()):
            if tid in parsed.tasks:
                continue
            for kv in kvs:
                out.append(
                    Finding(
                        index.problems[2],
                        tid,
                        f"{index.name} key {kv.key} names task {tid}, which does not exist",
                        (kv.key,),
                        Repair(
                            f"delete {index.name} key {kv.key}",
                            (Guard(keys.task(tid), 0), Guard(kv.key, kv.mod_revision)),
                            (RepairWrite(kv.key, None),),
                        ),
                    )
                )
    return out


def _missing(
    index: _Index, task: TaskRecord, kv: KV, want: str, stale: list[KV], fixable: bool
) -> Finding:
    """No key at the record's time: written from the record (any key at another time goes in
    the same txn, so the task is never in the index twice)."""
    tid, when = task.task_id, _when(index.due(task))
    guards = [Guard(kv.key, kv.mod_revision), Guard(want, 0)]
    guards += [Guard(s.key, s.mod_revision) for s in stale]
    writes = [RepairWrite(s.key, None) for s in stale] + [RepairWrite(want, b"")]
    if stale:
        problem = index.problems[1]
        message = (
            f"task {tid} is {task.state.name} and due at {when} but its {index.name} key says "
            f"otherwise ({', '.join(s.key for s in stale)}): {index.broken} at its time"
        )
        action = f"move its {index.name} key to {want}"
    else:
        problem = index.problems[0]
        message = (
            f"task {tid} is {task.state.name} and due at {when} but has no {index.name} key "
            f"{want}: {index.broken}"
        )
        action = f"add {index.name} key {want}"
    repair = Repair(action, tuple(guards), tuple(writes)) if fixable else None
    return Finding(problem, tid, message, (kv.key, want, *(s.key for s in stale)), repair)


def _orphan(
    index: _Index, task: TaskRecord, kv: KV, key_kv: KV, want: str | None, fixable: bool
) -> Finding:
    """A key the record does not call for: deleted."""
    state = task.state.name
    if want is not None:
        why = f"has its {index.name} key {want} and another"
    elif index.name == "deadline" and task.deadline:
        why = f"is {state}, awaiting no result, yet has a {index.name} key"
    elif index.name == "deadline":
        why = f"is {state} with no deadline yet has a {index.name} key"
    else:
        why = f"is {state} yet has a {index.name} key"
    repair = Repair(
        f"delete {index.name} key {key_kv.key}",
        (Guard(kv.key, kv.mod_revision), Guard(key_kv.key, key_kv.mod_revision)),
        (RepairWrite(key_kv.key, None),),
    )
    return Finding(
        index.problems[2],
        task.task_id,
        f"task {task.task_id} {why} {key_kv.key}",
        (kv.key, key_kv.key),
        repair if fixable else None,
    )


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
