"""What the checker reports about: the final tasks, and the violations it finds."""

from __future__ import annotations

from dataclasses import dataclass

from chaos.history import Op

SETTLED = "settled"
"""Reason of indefinite commits the checker settled from the final state (no log)."""


@dataclass(frozen=True)
class FinalTask:
    """A task as etcd holds it after the run."""

    task_id: str
    state: str
    revision: int = 0
    result_commit_id: str = ""  # "{attempt_id}@{generation}" of the canonical commit


@dataclass(frozen=True)
class Violation:
    """A broken rule, the task it concerns, and the operations involved."""

    rule: str
    task: str
    ops: tuple[str, ...]
    detail: str

    def __str__(self) -> str:
        return f"{self.rule} on {self.task or '-'}: {self.detail} [{', '.join(self.ops)}]"


def commit_id(op: Op) -> str:
    """The ``attempt_id@generation`` a commit by ``op``'s attempt would leave behind."""
    return f"{op.attempt_id}@{op.generation}"
