"""The primary evidence of a task against its record: the live claim key, the RUNNING attempts
and the event chain. These are written by the same transactions as the record, so a
disagreement here is a conflict between primary sources: reported, never repaired (see the
package docstring)."""

from __future__ import annotations

import itertools

from coordinator.doctor.findings import Finding, Problem
from coordinator.doctor.parsed import Parsed, decode_or_report
from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.records import AttemptRecord, ClaimRecord, EventRecord, TaskRecord
from coordinator.domain.states import AttemptEnd, Op, TaskState
from coordinator.store.etcd.ops import KV


def check_primary(parsed: Parsed, task: TaskRecord, kv: KV, out: list[Finding]) -> bool:
    """Claim key, attempts and event chain against the record; True on a primary conflict."""
    conflict = _check_claim_key(parsed, task, kv, out)
    _check_attempts(parsed, task, out)
    if not _check_events(parsed, task, kv, out):
        conflict = True
    return conflict


def _check_claim_key(parsed: Parsed, task: TaskRecord, kv: KV, out: list[Finding]) -> bool:
    """The live claim key against the record's state and attempt; True on a conflict."""
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
    return conflict


def _check_attempts(parsed: Parsed, task: TaskRecord, out: list[Finding]) -> None:
    """No attempt but the task's current one is still RUNNING; an attempt the task record holds
    (schema 3) is one a claim or a commit left there, and its key, if a checkpoint gave it one,
    agrees with the record on how it ended."""
    tid = task.task_id
    _check_recorded(parsed, task, out)
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


# The states a record holding its attempt may be in: a claim's, or a commit's.
_HOLDS_ATTEMPT = frozenset({TaskState.CLAIMED, TaskState.DONE, TaskState.REVIEW})


def _check_recorded(parsed: Parsed, task: TaskRecord, out: list[Finding]) -> None:
    recorded = recorded_attempt(task)
    if recorded is None:
        return
    tid, problem = task.task_id, ""
    named = f"/{recorded.attempt_id}"
    key = next((kv for kv in parsed.attempts.get(tid, []) if kv.key.endswith(named)), None)
    keyed = decode_or_report(parsed, AttemptRecord, key, tid) if key is not None else None
    if task.state not in _HOLDS_ATTEMPT:
        problem = (
            f"the record of {tid} holds attempt {recorded.attempt_id} but the task is "
            f"{task.state.name}: the move that left CLAIMED or DONE wrote no key for it"
        )
    elif keyed is not None and keyed.end is not recorded.end:
        problem = (
            f"attempt {recorded.attempt_id} of {tid} ended {keyed.end.name} by its key but "
            f"{recorded.end.name} by the task record, which still holds it"
        )
    if problem:
        out.append(Finding(Problem.ATTEMPT_MISMATCH, tid, problem, (key.key,) if key else ()))


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
