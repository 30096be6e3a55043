"""Settling from etcd's own history, and per-task linearizability over it.

Every call carries a request id, and the transition txn stores it in the task's event, so an
operation took effect exactly when its request id is in etcd's log (``settle_from_history``);
likewise every effect write stores it in the effect record (``settle_effects``).
Then, per task: what clients heard agrees with the log and the log with the final state
(``history_agreement``); the log in revision order is a sequence the model allows
(``log_replay``); and that order respects real time (``real_time_order``). Operations that wrote
nothing (refusals) are placed by the real-time model in chaos/checker.py instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from chaos.history import EffectWrite, EtcdWrite, Observed, Operation, OpKind
from chaos.model import CLAIMED, COMMITTED, NEW_ROUND, REFUSED, LogModel, apply
from chaos.violation import SETTLED, FinalTask, Rule, Violation
from coordinator.domain.states import Op as Transition

SETTLED_BY_HISTORY = "settled-by-history"
"""Reason of indefinite operations the checker settled from etcd's log."""

WRITES = {
    OpKind.CLAIM: Transition.CLAIM,
    OpKind.COMMIT: Transition.COMMIT,
    OpKind.UPDATE_INPUT: Transition.UPDATE_INPUT,
    OpKind.CANCEL: Transition.CANCEL,
}
"""Operations that make a transition when they take effect (so leave a write in the log), and
the transition each makes."""


def settle_from_history(ops: Iterable[Operation], writes: Sequence[EtcdWrite]) -> list[Operation]:
    """Each operation matched to the write its request id made (``applied_at``); indefinite
    ones settled by it: took effect (CLAIMED with the claim's task and generation, COMMITTED,
    OK) when the log holds their request id, ``LOST`` when it does not."""
    # Keyed by the kind of write too: a call is matched only to a transition of its own kind
    # (a claim that put a task on hold for approval wrote no claim).
    by_request = {(w.request_id, w.op): w for w in writes if w.request_id}
    settled = []
    for recorded in ops:
        made = WRITES.get(recorded.op)
        write = None
        if made is not None and recorded.request_id:
            write = by_request.get((recorded.request_id, made))
        op = recorded if write is None else replace(recorded, applied_at=write.revision)
        if not (op.indefinite and op.op in WRITES):
            settled.append(op)
        elif write is None:
            settled.append(replace(op, outcome=Observed.LOST, reason=SETTLED_BY_HISTORY))
        elif op.op is OpKind.CLAIM:
            settled.append(
                replace(
                    op,
                    outcome=CLAIMED,
                    reason=SETTLED_BY_HISTORY,
                    task=write.task,
                    attempt_id=write.attempt_id,
                    generation=write.generation,
                )
            )
        else:
            outcome = COMMITTED if op.op is OpKind.COMMIT else Observed.OK
            settled.append(replace(op, outcome=outcome, reason=SETTLED_BY_HISTORY))
    return settled


def settle_effects(ops: Iterable[Operation], writes: Sequence[EffectWrite]) -> list[Operation]:
    """Indefinite effect calls settled from the effect keys' history: every prepare, record,
    resolve and approval stores the request id of its call in the effect record, so a call took
    effect exactly when a write of its effect key carries its request id. Settled to the state
    its last such write left (PREPARED, COMMITTED, UNKNOWN, ABSENT), or ``LOST`` (it wrote
    nothing). An effect call spans several writes, so it is not placed in real-time order."""
    mine: dict[str, list[EffectWrite]] = {}
    for write in sorted(writes, key=lambda w: w.revision):
        if write.request_id:
            mine.setdefault(write.request_id, []).append(write)
    settled = []
    for op in ops:
        if not (op.indefinite and op.op is OpKind.EFFECT and op.request_id):
            settled.append(op)
            continue
        # Of that effect key when the invocation named one; else (the chaos worker's: the key
        # comes only with the answer) of the task.
        found = [
            w
            for w in mine.get(op.request_id, ())
            if (w.effect_id == op.effect_key if op.effect_key else w.task == op.task)
        ]
        if not found:
            settled.append(replace(op, outcome=Observed.LOST, reason=SETTLED_BY_HISTORY))
        else:
            last = found[-1]
            settled.append(
                replace(
                    op,
                    outcome=Observed(last.state.name),
                    reason=SETTLED_BY_HISTORY,
                    effect_key=last.effect_id,
                )
            )
    return settled


def history_agreement(
    task: str, ops: Sequence[Operation], writes: Sequence[EtcdWrite], final: FinalTask | None
) -> list[Violation]:
    """What clients heard agrees with etcd's log, and the log with the final state: a refused
    call wrote nothing; an acknowledged claim or commit is in the log; the log's canonical
    commit is the one etcd holds at the end."""
    commits_by = {w.attempt_id for w in writes if w.op is Transition.COMMIT}
    violations = [
        violation
        for op in ops
        if op.reason not in (SETTLED, SETTLED_BY_HISTORY)
        for violation in _heard_versus_log(task, op, commits_by)
    ]
    return violations + _log_versus_final(task, writes, final)


def _heard_versus_log(task: str, op: Operation, commits_by: set[str]) -> list[Violation]:
    """A refused call that wrote, or an acknowledged claim or commit missing from the log."""
    violations = []
    refused = op.outcome in REFUSED or (op.op is OpKind.CLAIM and op.outcome is not CLAIMED)
    if op.op in WRITES and refused and op.applied_at and not op.indefinite:
        violations.append(
            Violation(
                Rule.REFUSED_CALL_TOOK_EFFECT,
                task,
                (op.label(),),
                f"answered {op.outcome}, but its request wrote revision {op.applied_at}",
            )
        )
    missing = ""
    if op.op is OpKind.CLAIM and op.outcome is CLAIMED and op.applied_at != op.generation:
        missing = f"its claim is not in etcd's log at revision {op.generation}"
    if op.op is OpKind.COMMIT and op.outcome is COMMITTED and op.attempt_id not in commits_by:
        missing = "no commit by its attempt is in etcd's log"
    if missing:
        violations.append(
            Violation(Rule.ACKNOWLEDGED_CALL_NOT_IN_LOG, task, (op.label(),), missing)
        )
    return violations


def _log_versus_final(
    task: str, writes: Sequence[EtcdWrite], final: FinalTask | None
) -> list[Violation]:
    """The log's canonical commit of the final round is the one etcd holds at the end."""
    round_commit: EtcdWrite | None = None
    for write in writes:
        if write.op is Transition.COMMIT:
            round_commit = write
        elif write.op in NEW_ROUND:
            round_commit = None
    logged = f"{round_commit.attempt_id}@{round_commit.generation}" if round_commit else ""
    if final is None or not writes or final.result_commit_id == logged:
        return []
    return [
        Violation(
            Rule.LOG_DISAGREES_WITH_FINAL_STATE,
            task,
            (),
            f"the log's canonical commit is {logged or 'none'}, "
            f"etcd holds {final.result_commit_id or 'none'}",
        )
    ]


def log_replay(task: str, writes: Sequence[EtcdWrite]) -> list[Violation]:
    """etcd's event log of the task, in revision order, is a sequence the model allows."""
    state, violations = LogModel(), []
    for write in writes:
        state, problem = apply(state, write)
        if problem:
            label = f"{write.op}@{write.revision}({write.attempt_id or '-'})"
            violations.append(Violation(Rule.LOG_NOT_LINEARIZABLE, task, (label,), problem))
    return violations


def real_time_order(task: str, ops: Sequence[Operation]) -> list[Violation]:
    """The log's order respects real time: an operation that completed before another was
    invoked took effect at a lower revision (each op is placed at the revision it wrote)."""
    placed = sorted((o for o in ops if o.applied_at), key=lambda o: o.applied_at)
    violations = []
    earliest_end: Operation | None = None  # among the ops placed after the current one
    for op in reversed(placed):
        if earliest_end is not None and earliest_end.lasted < op.start:
            violations.append(
                Violation(
                    Rule.REAL_TIME_ORDER,
                    task,
                    (op.label(), earliest_end.label()),
                    f"revision {earliest_end.applied_at} completed before revision "
                    f"{op.applied_at} was invoked",
                )
            )
        if earliest_end is None or op.lasted < earliest_end.lasted:
            earliest_end = op
    return violations
