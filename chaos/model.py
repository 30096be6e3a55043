"""Pure models of one task under the claim.v1 contract.

``step(state, op) -> (state, allowed)`` replays the clients' operations in real-time order;
``apply(state, write) -> (state, problem)`` replays etcd's own event log in revision order, and
``spend(state, write, budget) -> (state, breach)`` replays it against the retry budget.

The model knows only what the history proves happened before an operation started: the claims
and commits that had already completed. ``allowed`` is the set of outcomes the coordinator may
answer the operation with, given that state; the checker reports an operation whose recorded
outcome is not in it, then folds the operation into the state at its completion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaos.history import EtcdWrite, Observed, Operation, OpKind
from chaos.violation import Rule
from coordinator.domain.states import Op as Transition
from coordinator.domain.states import TaskState

COMMITTED, FENCED, CLAIMED = Observed.COMMITTED, Observed.FENCED, Observed.CLAIMED
REFUSED = frozenset({FENCED, Observed.CANCELLED, Observed.STALE_INPUT, Observed.LOST})
"""Outcomes that leave nothing canonical behind (LOST: an indefinite commit that did not land;
a passed schedule_to_close is FENCED, reason DEADLINE_EXCEEDED)."""
ANY: frozenset[Observed] = frozenset(Observed)
"""The model does not constrain this operation: every outcome is allowed."""


@dataclass(frozen=True)
class TaskModel:
    """What is known about a task: its newest completed claim and its canonical commit."""

    generation: int = 0
    committed_by: str = ""  # attempt id of the canonical commit
    committed_revision: int = -1
    revision: int = 0  # the newest input revision an input change is known to have made
    cancelled: bool = False


def allows(allowed: frozenset[Observed], outcome: Observed) -> bool:
    """Whether ``outcome`` is one the model allows."""
    return outcome in allowed


def step(state: TaskModel, op: Operation) -> tuple[TaskModel, frozenset[Observed]]:
    """The outcomes ``op`` may have given ``state``, and the state after ``op`` completed."""
    if op.op is OpKind.CLAIM:
        return _claim_step(state, op)
    if op.op is OpKind.UPDATE_INPUT:
        if op.outcome is not Observed.OK:
            return state, ANY
        return replace(state, revision=max(state.revision, op.revision)), ANY
    if op.op is OpKind.CANCEL:
        return (replace(state, cancelled=True) if op.outcome is Observed.OK else state), ANY
    if op.op is OpKind.COMMIT:
        return _commit_step(state, op)
    return state, ANY


def _claim_step(state: TaskModel, op: Operation) -> tuple[TaskModel, frozenset[Observed]]:
    if op.outcome is not CLAIMED:
        return state, ANY
    fresh = op.generation > state.generation and op.revision != state.committed_revision
    after = replace(state, generation=max(op.generation, state.generation))
    return after, frozenset({CLAIMED}) if fresh else frozenset()


def _commit_step(state: TaskModel, op: Operation) -> tuple[TaskModel, frozenset[Observed]]:
    if state.committed_by:
        # Only a retry of the canonical attempt may hear COMMITTED again.
        same = op.attempt_id == state.committed_by
        return state, ANY if same else REFUSED
    if op.generation < state.generation:
        return state, REFUSED  # superseded by a claim that completed before this commit
    if op.revision < state.revision or state.cancelled:
        return state, REFUSED  # the input changed, or the task was cancelled, before it
    if op.outcome is COMMITTED:
        return replace(
            state, committed_by=op.attempt_id, committed_revision=op.revision
        ), frozenset({COMMITTED})
    return state, ANY


@dataclass(frozen=True)
class LogModel:
    """What etcd's event log says about a task so far: the live claim and the round's commit."""

    generation: int = 0
    holder: str = ""  # attempt id of the live claim ("" when none)
    committed: bool = False  # the current round (input revision) has its canonical commit


NEW_ROUND = frozenset({Transition.UPDATE_INPUT, Transition.REJECT})
"""Transitions that open a new round (revision + 1): a new canonical commit is due."""


def apply(state: LogModel, write: EtcdWrite) -> tuple[LogModel, str]:
    """The state after ``write``, and what is wrong with it ("" when the model allows it)."""
    if write.op is Transition.CLAIM:
        problem = ""
        if write.generation <= state.generation:
            problem = f"claim generation {write.generation} after generation {state.generation}"
        return replace(state, generation=write.generation, holder=write.attempt_id), problem
    if write.op is Transition.COMMIT:
        problem = ""
        if write.attempt_id != state.holder:
            problem = (
                f"commit by attempt {write.attempt_id} while the live claim is "
                f"{state.holder or 'none'}"
            )
        elif state.committed:
            problem = "a second canonical commit of the round"
        return replace(state, holder="", committed=True), problem
    if write.op in NEW_ROUND:
        return replace(state, holder="", committed=False), ""
    if write.to_state is not TaskState.CLAIMED:
        return replace(state, holder=""), ""
    return state, ""


@dataclass(frozen=True)
class BudgetModel:
    """What etcd's event log says about a task's retry budget (docs/work-queue.md): the
    attempts (claims) since the budget began, and whether the task is FAILED, the dead letter."""

    attempts: int = 0
    failed: bool = False


FRESH_BUDGET = frozenset({Transition.RETRY, Transition.UPDATE_INPUT})
"""Transitions that start a fresh budget (RetryTask sends a FAILED task back; a new input)."""


@dataclass(frozen=True)
class Breach:
    """A write the retry budget does not allow: the rule it breaks and how."""

    rule: Rule
    detail: str


# A flat decision table: one return per rule of the budget (a claim beyond it, a write after the
# dead letter, a dead letter too early, ...), clearer than nested branches.
def spend(  # noqa: PLR0911
    state: BudgetModel, write: EtcdWrite, budget: int
) -> tuple[BudgetModel, Breach | None]:
    """The budget after ``write`` and what, if anything, it breaks; ``budget`` is the task's
    max_attempts (0: unlimited or unknown, so only the dead letter's finality is checked).

    The chaos workers never report a failure (Fail) and set no deadline, so the one way a run
    dead-letters a task is an exhausted budget: a dead letter must come after exactly
    ``budget`` attempts, and nothing claims or commits the task after it."""
    if write.op in FRESH_BUDGET:
        return BudgetModel(), None
    if write.op is Transition.CLAIM:
        after = replace(state, attempts=state.attempts + 1)
        if state.failed:
            return after, Breach(Rule.WRITE_AFTER_DEAD_LETTER, "a claim of a FAILED task")
        if budget and state.attempts >= budget:
            detail = f"attempt {after.attempts} of a task whose budget is {budget}"
            return after, Breach(Rule.CLAIM_BEYOND_BUDGET, detail)
        return after, None
    if write.op is Transition.GIVE_BACK:
        # A claim whose answer reached nobody, given back: its attempt is not counted.
        return replace(state, attempts=max(state.attempts - 1, 0)), None
    if write.op is Transition.COMMIT and state.failed:
        return state, Breach(Rule.WRITE_AFTER_DEAD_LETTER, "a commit accepted on a FAILED task")
    if write.op is Transition.DEAD_LETTER:
        after = replace(state, failed=True)
        if budget and state.attempts < budget:
            detail = f"dead-lettered after {state.attempts} of its {budget} attempts"
            return after, Breach(Rule.DEAD_LETTER_BEFORE_BUDGET, detail)
        return after, None
    if write.to_state is TaskState.FAILED:
        return replace(state, failed=True), None
    return state, None
