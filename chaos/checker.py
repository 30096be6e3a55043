"""The checker: a recorded history plus the final state, against the rules of claim.v1.

Pure: it reads plain data (operations, the final tasks, etcd's event history, the downstream's
per-key counts, the replicas' fence coverage) and returns violations, each naming the task and
the operations that broke the rule.

Indefinite operations (``info``: a timeout, a lost response, a killed worker) are settled from
etcd's own history when the run has it: every call carries a request id, which the transition
txn stores in its event, so an operation took effect exactly when its request id is in the log.
The final state stays as a cross-check (and is the only evidence against a deployed coordinator,
where the runner cannot watch etcd). Indefinite effect calls are settled the same way from the
effect keys' history: each effect write stores the request id of its call. Per task, the
operations matched to a transition are then checked for linearizability: etcd's log, in revision
order, must be a sequence the model allows, and that order must respect real time (an operation
that completed before another started has the lower revision). Only operations without a write
(refusals, and indefinite ones without a history) are placed by the real-time model instead.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from chaos.abuse_check import (
    refused_at_the_caps,
    stream_refusals,
    unread_streams,
    unread_streams_ended,
)
from chaos.budget import budget_replay, missing_dead_letter
from chaos.delivery_check import abandoned_polls, undelivered_claims
from chaos.follow_check import follower_agreement
from chaos.history import INFO, EffectWrite, EtcdWrite, Observed, Operation, OpKind
from chaos.linearizability import (
    SETTLED_BY_HISTORY,
    history_agreement,
    log_replay,
    real_time_order,
    settle_effects,
    settle_from_history,
)
from chaos.model import CLAIMED, COMMITTED, FENCED, TaskModel, allows, step
from chaos.violation import SETTLED, FinalTask, Rule, Violation, commit_id
from coordinator.domain.states import FenceReason, TaskState

__all__ = [  # FinalTask and Violation live in chaos/violation.py; the checker re-exports them
    "CheckReport",
    "Coverage",
    "Evidence",
    "FinalTask",
    "Rule",
    "Violation",
    "check",
    "log_replay",
    "real_time_order",
    "settle",
]

LIVE_STATES = frozenset({TaskState.DONE, TaskState.CANCELLED, TaskState.READY, TaskState.CLAIMED})
"""Final states of a task that is not lost (CLAIMED: held, or claimable again once expired)."""


@dataclass(frozen=True)
class Coverage:
    """One replica's fence-check counters for one acceptance point (AdminService.GetStats)."""

    replica: str
    point: str
    accepted: int
    validated: int


@dataclass(frozen=True)
class Evidence:
    """Everything the checker reads."""

    ops: Sequence[Operation]
    final: Mapping[str, FinalTask]
    expected_tasks: frozenset[str] = frozenset()
    performed: Mapping[str, int] = field(default_factory=dict)  # downstream key -> times
    coverage: Sequence[Coverage] = ()
    # etcd's event log of the run (chaos/etcd_history.py); None where it cannot be read.
    writes: Sequence[EtcdWrite] | None = None
    # etcd's history of the effect keys (chaos/etcd_history.py); None where it cannot be read.
    effect_writes: Sequence[EffectWrite] | None = None
    # What the run's WatchEvents follower received, in arrival order (chaos/follower.py);
    # None where no follower ran. Compared with ``writes``.
    followed: Sequence[EtcdWrite] | None = None
    # Tasks the scenario poisoned (their worker dies on every attempt): each must end FAILED
    # for an exhausted retry budget (chaos/budget.py).
    poisoned: frozenset[str] = frozenset()


@dataclass(frozen=True)
class CheckReport:
    """The counts a report shows, and the violations."""

    operations: int
    commits: int
    fenced: Mapping[str, int]
    reconciled: int
    indefinite: int
    violations: tuple[Violation, ...]
    fence_checks: int = 0  # accepted operations the replicas' GetStats counted (all validated)
    settled_by_history: int = 0  # indefinite operations settled from etcd's own history
    followed: int = 0  # events the WatchEvents follower received
    streams_refused: int = 0  # flood streams refused RESOURCE_EXHAUSTED (the abuse scenario)
    # Streams nobody read that the server ended, by the bound that did (the abuse scenario).
    unread_ended: Mapping[str, int] = field(default_factory=dict)
    dead_lettered: int = 0  # tasks FAILED for an exhausted retry budget (the poison scenario)
    abandoned_polls: int = 0  # long polls their callers left first (the long-poll-cancel scenario)
    # Claims of abandoned polls made before their caller left whose answer was lost on its way
    # (counted: the server cannot see it; chaos/delivery_check.py).
    lost_in_flight: int = 0
    given_back: int = 0  # claims the replicas gave back undelivered (give_back in etcd's log)

    @property
    def ok(self) -> bool:
        """Whether no rule was broken."""
        return not self.violations


def settle(ops: Iterable[Operation], final: Mapping[str, FinalTask]) -> list[Operation]:
    """Indefinite commits settled from the final state: COMMITTED if theirs is the canonical
    result, else ``LOST`` (it did not take effect). Other indefinite operations stay ``info``."""
    settled = []
    for op in ops:
        if op.indefinite and op.op is OpKind.COMMIT:
            task = final.get(op.task)
            landed = task is not None and task.result_commit_id == commit_id(op)
            outcome = COMMITTED if landed else Observed.LOST
            settled.append(replace(op, outcome=outcome, reason=SETTLED))
        else:
            settled.append(op)
    return settled


def _history_rules(
    task: str, task_ops: list[Operation], writes: list[EtcdWrite], final: FinalTask | None
) -> list[Violation]:
    """The rules that read etcd's own history of ``task`` (when the run has it)."""
    task_writes = sorted(writes, key=lambda w: w.position)
    return [
        *history_agreement(task, task_ops, task_writes, final),
        *log_replay(task, task_writes),
        *real_time_order(task, task_ops),
        *budget_replay(task, task_writes, final.max_attempts if final else 0),
    ]


def _settled(evidence: Evidence) -> list[Operation]:
    """The recorded ops with their indefinite outcomes settled (by etcd's history if any)."""
    if evidence.writes is None:
        ops = settle(evidence.ops, evidence.final)
    else:
        ops = settle_from_history(evidence.ops, evidence.writes)
    if evidence.effect_writes is not None:
        ops = settle_effects(ops, evidence.effect_writes)
    return ops


def check(evidence: Evidence) -> CheckReport:
    """Every rule over the evidence."""
    ops = _settled(evidence)
    by_task: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        if op.task:  # a claim that got no task names none
            by_task[op.task].append(op)
    writes_of: dict[str, list[EtcdWrite]] = defaultdict(list)
    for write in evidence.writes or ():
        writes_of[write.task].append(write)
    violations: list[Violation] = []
    for task in sorted(set(by_task) | set(writes_of)):
        task_ops, final = by_task.get(task, []), evidence.final.get(task)
        violations += double_commits(task, task_ops)
        violations += model_order(task, task_ops)
        violations += lost_commits(task, task_ops, final)
        violations += stale_results(task, task_ops, final)
        if evidence.writes is not None:
            violations += _history_rules(task, task_ops, writes_of.get(task, []), final)
    if evidence.followed is not None and evidence.writes is not None:
        violations += follower_agreement(evidence.followed, evidence.writes)
    in_flight = 0
    if evidence.writes is not None:  # claims nobody received, against the log
        undelivered, in_flight = undelivered_claims(evidence.ops, evidence.writes)
        violations += undelivered
    for task in sorted(evidence.poisoned):
        poisoned_writes = None
        if evidence.writes is not None:
            poisoned_writes = sorted(writes_of.get(task, []), key=lambda w: w.position)
        violations += missing_dead_letter(task, evidence.final.get(task), poisoned_writes)
    violations += old_epoch_commits(ops)
    violations += stream_refusals(ops)
    violations += unread_streams(ops)
    violations += duplicate_effects(evidence.performed)
    violations += lost_tasks(
        evidence.expected_tasks | evidence.poisoned | set(by_task), evidence.final
    )
    violations += coverage_gaps(evidence.coverage)
    commits = [o for o in ops if o.op is OpKind.COMMIT]
    # Refused commits by reason (FENCED's reason; CANCELLED and STALE_INPUT by outcome).
    fenced = Counter(
        (o.reason or "?") if o.outcome is FENCED else o.outcome.value
        for o in commits
        if o.outcome in (FENCED, Observed.CANCELLED, Observed.STALE_INPUT)
    )
    return CheckReport(
        operations=len(ops),
        commits=sum(o.outcome is COMMITTED for o in commits),
        fenced=dict(fenced),
        reconciled=sum(o.op is OpKind.EFFECT and o.outcome is Observed.RECONCILED for o in ops),
        indefinite=sum(o.outcome is INFO for o in evidence.ops),
        violations=tuple(violations),
        fence_checks=sum(c.accepted for c in evidence.coverage),
        settled_by_history=sum(o.reason == SETTLED_BY_HISTORY for o in ops),
        followed=len(evidence.followed or ()),
        streams_refused=sum(refused_at_the_caps(o) for o in ops),
        unread_ended=unread_streams_ended(ops),
        dead_lettered=sum(t.dead_lettered for t in evidence.final.values()),
        abandoned_polls=abandoned_polls(evidence.ops),
        lost_in_flight=in_flight,
        given_back=sum(w.given_back for w in evidence.writes or ()),
    )


def double_commits(task: str, ops: Sequence[Operation]) -> list[Violation]:
    """At most one attempt's commit is canonical per task revision."""
    winners: dict[int, dict[str, Operation]] = defaultdict(dict)
    for op in ops:
        if op.op is OpKind.COMMIT and op.outcome is COMMITTED:
            winners[op.revision].setdefault(op.attempt_id, op)
    return [
        Violation(
            Rule.DOUBLE_COMMIT,
            task,
            tuple(o.label() for o in won.values()),
            f"{len(won)} attempts committed revision {revision}",
        )
        for revision, won in sorted(winners.items())
        if len(won) > 1
    ]


def model_order(task: str, ops: Sequence[Operation]) -> list[Violation]:
    """Replay the task's operations in real-time order against the model: each outcome must be
    one the model allows given what completed before the operation started."""
    events: list[tuple[float, int, Operation]] = []
    for op in ops:
        events.append((op.start, 1, op))  # check at invocation
        if op.end is not None:
            events.append((op.end, 0, op))  # apply at completion (before a check at that time)
    state = TaskModel()
    violations = []
    for _, kind, op in sorted(events, key=lambda e: (e[0], e[1])):
        after, allowed = step(state, op)
        if kind == 0:
            state = after
        elif not allows(allowed, op.outcome):
            rule = (
                Rule.LATE_WRITE_NOT_FENCED
                if op.op is OpKind.COMMIT
                else Rule.GENERATION_NOT_INCREASING
            )
            detail = (
                f"{op.outcome} but the model allows {sorted(allowed) or 'nothing'} "
                f"(newest completed claim g={state.generation}, committed by "
                f"{state.committed_by or '-'})"
            )
            violations.append(Violation(rule, task, (op.label(),), detail))
    return violations


def old_epoch_commits(ops: Sequence[Operation]) -> list[Violation]:
    """A commit invoked after an epoch bump completed, by an attempt whose claim completed before
    the bump began, carries the old epoch: it must be refused, and when FENCED then with
    EPOCH_CHANGED (only CANCELLED and STALE_INPUT come before the epoch in the coordinator's
    order of reasons). A retry by an attempt that committed before it may hear COMMITTED."""
    bumps = [o for o in ops if o.op is OpKind.BUMP_EPOCH and o.outcome is Observed.OK]
    if not bumps:
        return []
    claimed = {
        o.attempt_id: o.lasted
        for o in ops
        if o.op is OpKind.CLAIM and o.outcome is CLAIMED and o.attempt_id
    }
    committed: dict[str, float] = {}  # attempt -> when its first acknowledged commit ended
    for o in ops:
        if o.op is OpKind.COMMIT and o.outcome is COMMITTED:
            committed[o.attempt_id] = min(committed.get(o.attempt_id, o.lasted), o.lasted)
    violations = []
    for op in ops:
        if op.op is not OpKind.COMMIT or op.outcome is INFO or op.attempt_id not in claimed:
            continue
        old = any(claimed[op.attempt_id] < b.start and b.lasted < op.start for b in bumps)
        if not old or committed.get(op.attempt_id, op.start) < op.start:
            continue
        heard = f"{op.outcome}" + (f" ({op.reason})" if op.reason else "")
        if op.outcome is COMMITTED or (
            op.outcome is FENCED and op.reason != FenceReason.EPOCH_CHANGED.name
        ):
            violations.append(
                Violation(
                    Rule.OLD_EPOCH_NOT_FENCED,
                    op.task,
                    (op.label(),),
                    f"a commit of the epoch before a bump answered {heard}, not EPOCH_CHANGED",
                )
            )
    return violations


def lost_commits(task: str, ops: Sequence[Operation], final: FinalTask | None) -> list[Violation]:
    """Every acknowledged commit is the canonical result etcd holds at the end."""
    acked = [
        o
        for o in ops
        if o.op is OpKind.COMMIT
        and o.outcome is COMMITTED
        and o.reason not in (SETTLED, SETTLED_BY_HISTORY)
    ]
    return [
        Violation(
            Rule.ACKNOWLEDGED_COMMIT_LOST,
            task,
            (op.label(),),
            f"etcd holds {final.result_commit_id if final else 'no task'!r}, not {commit_id(op)!r}",
        )
        for op in acked
        if final is None or final.result_commit_id != commit_id(op)
    ]


def stale_results(task: str, ops: Sequence[Operation], final: FinalTask | None) -> list[Violation]:
    """The canonical result of a task is for its final input: the attempt that committed it
    claimed the task at the final revision (an input change ends older rounds' claims)."""
    if final is None or not final.result_commit_id or not final.revision:
        return []
    attempt = final.result_commit_id.rsplit("@", 1)[0]
    claims = [o for o in ops if o.op is OpKind.CLAIM and o.outcome is CLAIMED]
    return [
        Violation(
            Rule.STALE_RESULT,
            task,
            (op.label(),),
            f"the canonical result is by an attempt that ran on revision {op.revision}, "
            f"the task's input is at revision {final.revision}",
        )
        for op in claims
        if op.attempt_id == attempt and op.revision and op.revision != final.revision
    ]


def duplicate_effects(performed: Mapping[str, int]) -> list[Violation]:
    """No effect performed twice at the downstream."""
    return [
        Violation(Rule.DUPLICATE_EFFECT, key, (), f"performed {n} times at the downstream")
        for key, n in sorted(performed.items())
        if n > 1
    ]


def lost_tasks(task_ids: Iterable[str], final: Mapping[str, FinalTask]) -> list[Violation]:
    """Each task is DONE, CANCELLED, claimable again (READY, or CLAIMED), or FAILED for an
    exhausted retry budget (the dead letter the retry policy allows)."""
    violations = []
    for task_id in sorted(task_ids):
        got = final.get(task_id)
        if got is None or (got.state not in LIVE_STATES and not got.dead_lettered):
            state = got.state.name if got else "missing"
            if got is not None and got.state is TaskState.FAILED:
                state += (
                    f" ({got.dead_letter_reason.name} after {got.attempts_counted} of "
                    f"{got.max_attempts} attempts)"
                )
            violations.append(Violation(Rule.LOST_TASK, task_id, (), f"final state {state}"))
    return violations


def coverage_gaps(coverage: Iterable[Coverage]) -> list[Violation]:
    """Fence-check coverage is 100% at every acceptance point of every replica."""
    return [
        Violation(
            Rule.FENCE_COVERAGE,
            "",
            (f"{c.replica}:{c.point}",),
            f"{c.validated}/{c.accepted} accepted operations validated the fence",
        )
        for c in coverage
        if c.validated != c.accepted
    ]
