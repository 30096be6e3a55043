"""The retry budget and the dead letter (docs/work-queue.md), against etcd's log and the final
state.

Every claim starts an attempt counted against the task's ``max_attempts``, from its creation
(RetryTask and an input change start a fresh budget), except one given back because its
answer reached nobody (``give_back``: the attempt is not counted). Per task, etcd's log
replayed in revision order (``chaos/model.py``'s ``spend``) allows no claim beyond the budget,
no claim or commit once the task is FAILED, and no dead letter before the budget is used. A
task the scenario poisoned (its worker dies on every attempt) must end FAILED for an exhausted
budget after exactly ``max_attempts`` claims; FAILED so is also a legitimate end for any other
task (``lost_tasks`` in chaos/checker.py accepts it), every other FAILED is a lost task.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaos.history import EtcdWrite
from chaos.model import BudgetModel, spend
from chaos.violation import FinalTask, Rule, Violation
from coordinator.domain.states import Op as Transition


def budget_replay(task: str, writes: Sequence[EtcdWrite], budget: int) -> list[Violation]:
    """Each write of the task's log, in revision order, that the retry budget does not allow."""
    state, violations = BudgetModel(), []
    for write in writes:
        state, breach = spend(state, write, budget)
        if breach is not None:
            label = f"{write.op}@{write.revision}({write.attempt_id or '-'})"
            violations.append(Violation(breach.rule, task, (label,), breach.detail))
    return violations


def claims_in_budget(writes: Sequence[EtcdWrite]) -> int:
    """The claims the log holds since the task's budget last began."""
    state = BudgetModel()
    for write in writes:
        state, _ = spend(state, write, 0)
    return state.attempts


def missing_dead_letter(
    task: str, final: FinalTask | None, writes: Sequence[EtcdWrite] | None
) -> list[Violation]:
    """A poisoned task must end FAILED (EXHAUSTED) after exactly its budget of attempts, by the
    final state and, where it is read, by etcd's log."""
    if final is None:
        return [Violation(Rule.DEAD_LETTER_MISSING, task, (), "the poisoned task is missing")]
    problems = []
    if not final.dead_lettered:
        problems.append(
            f"it ended {final.state.name} ({final.dead_letter_reason.name}) after "
            f"{final.attempts_counted} of {final.max_attempts} attempts"
        )
    if writes is not None:
        claims = claims_in_budget(writes)
        if claims != final.max_attempts:
            problems.append(f"etcd's log holds {claims} claims, its budget is {final.max_attempts}")
        if not any(w.op is Transition.DEAD_LETTER for w in writes):
            problems.append("etcd's log holds no dead_letter")
    if not problems:
        return []
    detail = "not dead-lettered as its budget says: " + "; ".join(problems)
    return [Violation(Rule.DEAD_LETTER_MISSING, task, (), detail)]
