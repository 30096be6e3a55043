"""The checks themselves: one pure pass over a snapshot (see the package docstring)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TypeVar

from coordinator.doctor.due_indexes import check_due_indexes, check_due_orphans
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
from coordinator.doctor.parsed import Parsed, decode_or_report, parse
from coordinator.doctor.retention import check_retention
from coordinator.domain.keys import Keyspace
from coordinator.domain.lineage import identity_keys
from coordinator.domain.records import (
    AttemptRecord,
    ClaimRecord,
    EventRecord,
    ResultRecord,
    TaskRecord,
)
from coordinator.domain.retention import DEFAULT_RETENTION
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.domain.waiting import blocking
from coordinator.store.etcd.ops import KV
from coordinator.store.lifecycle.dependencies import edges_of

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
    conflict = _check_primary(parsed, keys, task, kv, out)
    # Derived keys are repaired only when the primary evidence agrees with the record.
    fixable = not conflict
    _check_ready(parsed, keys, task, kv, out, fixable)
    for state, name, missing, orphan in _STATE_INDEXES:
        present = getattr(parsed, name).get(task_id)
        key = getattr(keys, name)(task_id)
        _check_index(out, task, kv, fixable, state, present, key, (missing, orphan))
    out += check_due_indexes(parsed, keys, task, kv, fixable)
    _check_results(parsed, keys, task, out)
    _check_edges(parsed, keys, task, kv, out)
    _check_identity(parsed, keys, task, kv, out)
    return out


def _check_primary(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, out: list[Finding]
) -> bool:
    """Claim key, attempts and event chain against the record; True on a primary conflict."""
    tid, conflict = task.task_id, False
    claim_kv = parsed.claims.get(tid)
    if claim_kv is not None and task.state is not TaskState.CLAIMED:
        out.append(
            Finding(
                Problem.TASK_IN_TWO_PLACES,
                tid,
                f"task {tid} is {task.state.name} but a live claim key holds it "
                f"(lease {claim_kv.lease}); which one is true is not guessed",
                (kv.key, claim_kv.key),
            )
        )
        conflict = True
    elif claim_kv is not None:
        claim = decode_or_report(parsed, ClaimRecord, claim_kv, tid)
        if claim is not None and (
            claim.attempt_id != task.attempt_id or claim_kv.create_revision != kv.mod_revision
        ):
            out.append(
                Finding(
                    Problem.CLAIM_KEY_MISMATCH,
                    tid,
                    f"claim key of {tid} is attempt {claim.attempt_id} at generation "
                    f"{claim_kv.create_revision}; the record names attempt {task.attempt_id} at "
                    f"state_version {kv.mod_revision}",
                    (kv.key, claim_kv.key),
                )
            )
            conflict = True
    elif task.state is TaskState.CLAIMED:
        out.append(
            Finding(
                Problem.CLAIM_EXPIRED_UNRECLAIMED,
                tid,
                f"task {tid} is CLAIMED by attempt {task.attempt_id} but its claim key is gone and "
                "no reclaimer moved it back to READY (is any replica running?)",
                (kv.key,),
                state_version=kv.mod_revision,
            )
        )
    for attempt_kv in parsed.attempts.get(tid, []):
        attempt = decode_or_report(parsed, AttemptRecord, attempt_kv, tid)
        if attempt is None or attempt.end is not AttemptEnd.RUNNING:
            continue
        if task.state is not TaskState.CLAIMED or attempt.attempt_id != task.attempt_id:
            out.append(
                Finding(
                    Problem.ATTEMPT_MISMATCH,
                    tid,
                    f"attempt {attempt.attempt_id} of {tid} is still RUNNING but the task is "
                    f"{task.state.name} (current attempt {task.attempt_id or 'none'})",
                    (attempt_kv.key,),
                )
            )
    if not _check_events(parsed, task, kv, out):
        conflict = True
    return conflict


# The ops a task's first event may have (a task created with a not_before starts DELAYED).
_CREATIONS = frozenset({Op.CREATE, Op.CREATE_WAITING, Op.CREATE_DELAYED})


def _check_events(parsed: Parsed, task: TaskRecord, kv: KV, out: list[Finding]) -> bool:
    """One event per transition, chained by state_version, ending in the record's state."""
    tid, chain = task.task_id, sorted(parsed.events.get(task.task_id, []), key=lambda e: e.key)
    events = [(e, decode_or_report(parsed, EventRecord, e, tid)) for e in chain]
    problems: list[str] = []
    if not events:
        problems.append("it has no events")
    else:
        first_kv, first = events[0]
        if first is not None and (first.op not in _CREATIONS or first.from_state is not None):
            problems.append(f"its first event is {first.op.value}, not a creation")
        if int(first_kv.key.rsplit("/", 1)[1]) != 0:
            problems.append("its first event is not keyed 0")
        for (a_kv, a), (b_kv, b) in itertools.pairwise(events):
            if int(b_kv.key.rsplit("/", 1)[1]) != a_kv.create_revision:
                problems.append(
                    f"an event is missing between revision {a_kv.create_revision} and "
                    f"{b_kv.create_revision}"
                )
            elif a is not None and b is not None and b.from_state is not a.to_state:
                problems.append(
                    f"event at {b_kv.create_revision} starts from "
                    f"{b.from_state.name if b.from_state else 'nothing'}, the one before ended "
                    f"in {a.to_state.name}"
                )
        last_kv, last = events[-1]
        if last_kv.create_revision != kv.mod_revision:
            problems.append(
                f"its last event is at revision {last_kv.create_revision}, the record was "
                f"written at {kv.mod_revision} (a transition without its event)"
            )
        elif last is not None and last.to_state is not task.state:
            problems.append(f"its last event ends in {last.to_state.name}")
    if problems:
        out.append(
            Finding(
                Problem.EVENT_CHAIN_BROKEN,
                tid,
                f"event log of {tid} ({task.state.name}) disagrees: " + "; ".join(problems),
                (kv.key,),
            )
        )
        return False
    return True


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


def _check_edges(
    parsed: Parsed, keys: Keyspace, task: TaskRecord, kv: KV, out: list[Finding]
) -> None:
    tid = task.task_id
    deps_kv = parsed.deps.get(tid)
    stored = edges_of(deps_kv.value) if deps_kv is not None else ()
    if stored != task.depends_on:
        out.append(
            Finding(
                Problem.EDGES_MISMATCH,
                tid,
                f"task {tid} lists depends_on {list(task.depends_on)} but its edge key holds "
                f"{list(stored)}",
                (kv.key, keys.deps(tid)),
            )
        )
        return  # which edge list is true is not guessed: no reverse-edge repair either
    for upstream in task.depends_on:
        if upstream not in parsed.tasks and upstream not in parsed.tombstones:
            out.append(
                Finding(
                    Problem.DEPENDENCY_DANGLING,
                    tid,
                    f"task {tid} depends on {upstream}, which does not exist",
                    (kv.key, keys.task(upstream)),
                )
            )
        reverse = keys.dependent(upstream, tid)
        if tid not in parsed.dependents.get(upstream, {}):
            out.append(
                Finding(
                    Problem.REVERSE_EDGE_MISSING,
                    tid,
                    f"edge {tid} -> {upstream} has no reverse edge: the releaser would not see "
                    f"{upstream} finish",
                    (kv.key, reverse),
                    Repair(
                        f"add reverse edge {reverse}",
                        (Guard(kv.key, kv.mod_revision), Guard(reverse, 0)),
                        (RepairWrite(reverse, b""),),
                    ),
                )
            )
    upstreams = [parsed.tasks[u][1] for u in task.depends_on if u in parsed.tasks]
    blocked = blocking(upstreams)
    if task.state is TaskState.WAITING and blocked != task.blocked_by:
        out.append(
            Finding(
                Problem.BLOCKED_MARK_OVERDUE,
                tid,
                f"task {tid} is WAITING marked blocked by ({', '.join(task.blocked_by)}) but its "
                f"FAILED or CANCELLED upstreams are ({', '.join(blocked)}) and no releaser "
                "updated the mark (is any replica running?)",
                (kv.key,),
                state_version=kv.mod_revision,
            )
        )
    elif task.state is TaskState.WAITING and all(
        u in parsed.tasks and parsed.tasks[u][1].state is TaskState.DONE for u in task.depends_on
    ):
        out.append(
            Finding(
                Problem.RELEASE_OVERDUE,
                tid,
                f"task {tid} is WAITING but every upstream is DONE and no releaser moved it to "
                "READY (is any replica running?)",
                (kv.key,),
                state_version=kv.mod_revision,
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
