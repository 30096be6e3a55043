"""The checker: a recorded history plus the final state, against the rules of claim.v1.

Pure: it reads plain data (operations, the final tasks, the downstream's per-key counts, the
replicas' fence coverage) and returns violations, each naming the task and the operations that
broke the rule. Indefinite operations (``info``) are first settled from the final state.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from chaos.history import INFO, Op
from chaos.model import COMMITTED, TaskModel, allows, step

LIVE_STATES = frozenset({"DONE", "CANCELLED", "READY", "CLAIMED"})
"""Final states of a task that is not lost (CLAIMED: held, or claimable again once expired)."""


@dataclass(frozen=True)
class FinalTask:
    """A task as etcd holds it after the run."""

    task_id: str
    state: str
    revision: int = 0
    result_commit_id: str = ""  # "{attempt_id}@{generation}" of the canonical commit


@dataclass(frozen=True)
class Coverage:
    """One replica's fence-check counters for one acceptance point (AdminService.GetStats)."""

    replica: str
    point: str
    accepted: int
    validated: int


@dataclass(frozen=True)
class Violation:
    """A broken rule, the task it concerns, and the operations involved."""

    rule: str
    task: str
    ops: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} on {self.task or '-'}: {self.detail} [{', '.join(self.ops)}]"


@dataclass(frozen=True)
class Evidence:
    """Everything the checker reads."""

    ops: Sequence[Op]
    final: Mapping[str, FinalTask]
    expected_tasks: frozenset[str] = frozenset()
    performed: Mapping[str, int] = field(default_factory=dict)  # downstream key -> times
    coverage: Sequence[Coverage] = ()


@dataclass(frozen=True)
class Verdict:
    """The counts a report shows, and the violations."""

    operations: int
    commits: int
    fenced: Mapping[str, int]
    reconciled: int
    indefinite: int
    violations: tuple[Violation, ...]
    fence_checks: int = 0  # accepted operations the replicas' GetStats counted (all validated)

    @property
    def ok(self) -> bool:
        """Whether no rule was broken."""
        return not self.violations


def commit_id(op: Op) -> str:
    """The ``attempt_id@generation`` a commit by ``op``'s attempt would leave behind."""
    return f"{op.attempt_id}@{op.generation}"


def settle(ops: Iterable[Op], final: Mapping[str, FinalTask]) -> list[Op]:
    """Indefinite commits settled from etcd: COMMITTED if theirs is the canonical result, else
    ``LOST`` (it did not take effect). Other indefinite operations stay ``info``."""
    settled = []
    for op in ops:
        if op.indefinite and op.op == "commit":
            task = final.get(op.task)
            landed = task is not None and task.result_commit_id == commit_id(op)
            settled.append(replace(op, outcome=COMMITTED if landed else "LOST", reason="settled"))
        else:
            settled.append(op)
    return settled


def check(evidence: Evidence) -> Verdict:
    """Every rule over the evidence."""
    ops = settle(evidence.ops, evidence.final)
    by_task: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.task:  # a claim that got no task names none
            by_task[op.task].append(op)
    violations: list[Violation] = []
    for task, task_ops in sorted(by_task.items()):
        violations += double_commits(task, task_ops)
        violations += model_order(task, task_ops)
        violations += lost_commits(task, task_ops, evidence.final.get(task))
    violations += duplicate_effects(evidence.performed)
    violations += lost_tasks(evidence.expected_tasks | set(by_task), evidence.final)
    violations += coverage_gaps(evidence.coverage)
    commits = [o for o in ops if o.op == "commit"]
    # Refused commits by reason (FENCED's reason; CANCELLED and STALE_INPUT by outcome).
    fenced = Counter(
        (o.reason or "?") if o.outcome == "FENCED" else o.outcome
        for o in commits
        if o.outcome in ("FENCED", "CANCELLED", "STALE_INPUT")
    )
    return Verdict(
        operations=len(ops),
        commits=sum(o.outcome == COMMITTED for o in commits),
        fenced=dict(fenced),
        reconciled=sum(o.op == "effect" and o.outcome == "RECONCILED" for o in ops),
        indefinite=sum(o.outcome == INFO for o in evidence.ops),
        violations=tuple(violations),
        fence_checks=sum(c.accepted for c in evidence.coverage),
    )


def double_commits(task: str, ops: Sequence[Op]) -> list[Violation]:
    """At most one attempt's commit is canonical per task revision."""
    winners: dict[int, dict[str, Op]] = defaultdict(dict)
    for op in ops:
        if op.op == "commit" and op.outcome == COMMITTED:
            winners[op.revision].setdefault(op.attempt_id, op)
    return [
        Violation(
            "double-commit",
            task,
            tuple(o.label() for o in won.values()),
            f"{len(won)} attempts committed revision {revision}",
        )
        for revision, won in sorted(winners.items())
        if len(won) > 1
    ]


def model_order(task: str, ops: Sequence[Op]) -> list[Violation]:
    """Replay the task's operations in real-time order against the model: each outcome must be
    one the model allows given what completed before the operation started."""
    events: list[tuple[float, int, Op]] = []
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
            rule = "late-write-not-fenced" if op.op == "commit" else "generation-not-increasing"
            detail = (
                f"{op.outcome} but the model allows {sorted(allowed) or 'nothing'} "
                f"(newest completed claim g={state.generation}, committed by "
                f"{state.committed_by or '-'})"
            )
            violations.append(Violation(rule, task, (op.label(),), detail))
    return violations


def lost_commits(task: str, ops: Sequence[Op], final: FinalTask | None) -> list[Violation]:
    """Every acknowledged commit is the canonical result etcd holds at the end."""
    acked = [
        o for o in ops if o.op == "commit" and o.outcome == COMMITTED and o.reason != "settled"
    ]
    return [
        Violation(
            "acknowledged-commit-lost",
            task,
            (op.label(),),
            f"etcd holds {final.result_commit_id if final else 'no task'!r}, not {commit_id(op)!r}",
        )
        for op in acked
        if final is None or final.result_commit_id != commit_id(op)
    ]


def duplicate_effects(performed: Mapping[str, int]) -> list[Violation]:
    """No effect performed twice at the downstream."""
    return [
        Violation("duplicate-effect", key, (), f"performed {n} times at the downstream")
        for key, n in sorted(performed.items())
        if n > 1
    ]


def lost_tasks(task_ids: Iterable[str], final: Mapping[str, FinalTask]) -> list[Violation]:
    """Each task is DONE, CANCELLED, or claimable again (READY, or CLAIMED)."""
    violations = []
    for task_id in sorted(task_ids):
        got = final.get(task_id)
        if got is None or got.state not in LIVE_STATES:
            state = got.state if got else "missing"
            violations.append(Violation("lost-task", task_id, (), f"final state {state}"))
    return violations


def coverage_gaps(coverage: Iterable[Coverage]) -> list[Violation]:
    """Fence-check coverage is 100% at every acceptance point of every replica."""
    return [
        Violation(
            "fence-coverage",
            "",
            (f"{c.replica}:{c.point}",),
            f"{c.validated}/{c.accepted} accepted operations validated the fence",
        )
        for c in coverage
        if c.validated != c.accepted
    ]
