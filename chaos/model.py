"""A pure model of one task under the claim.v1 contract: ``step(state, op) -> (state, allowed)``.

The model knows only what the history proves happened before an operation started: the claims
and commits that had already completed. ``allowed`` is the set of outcomes the coordinator may
answer the operation with, given that state; the checker reports an operation whose recorded
outcome is not in it, then folds the operation into the state at its completion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaos.history import Op

COMMITTED, FENCED, CLAIMED = "COMMITTED", "FENCED", "CLAIMED"
REFUSED = frozenset({FENCED, "CANCELLED", "STALE_INPUT", "LOST"})
"""Outcomes that leave nothing canonical behind (LOST: an indefinite commit that did not land)."""
ANY = frozenset({"*"})
"""Marker: the model does not constrain this operation."""


@dataclass(frozen=True)
class TaskModel:
    """What is known about a task: its newest completed claim and its canonical commit."""

    generation: int = 0
    committed_by: str = ""  # attempt id of the canonical commit
    committed_revision: int = -1


def allows(allowed: frozenset[str], outcome: str) -> bool:
    """Whether ``outcome`` is one the model allows."""
    return allowed is ANY or outcome in allowed


def step(state: TaskModel, op: Op) -> tuple[TaskModel, frozenset[str]]:
    """The outcomes ``op`` may have given ``state``, and the state after ``op`` completed."""
    if op.op == "claim":
        if op.outcome != CLAIMED:
            return state, ANY
        fresh = op.generation > state.generation and op.revision != state.committed_revision
        after = replace(state, generation=max(op.generation, state.generation))
        return after, frozenset({CLAIMED}) if fresh else frozenset()
    if op.op == "commit":
        if state.committed_by:
            # Only a retry of the canonical attempt may hear COMMITTED again.
            same = op.attempt_id == state.committed_by
            return state, ANY if same else REFUSED
        if op.generation < state.generation:
            return state, REFUSED  # superseded by a claim that completed before this commit
        if op.outcome == COMMITTED:
            return replace(
                state, committed_by=op.attempt_id, committed_revision=op.revision
            ), frozenset({COMMITTED})
        return state, ANY
    return state, ANY
