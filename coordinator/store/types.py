"""What the store's operations take and return (frozen, no etcd types)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from coordinator.domain.decisions import Fence, Verdict
from coordinator.domain.records import TaskRecord
from coordinator.domain.states import TaskState


@dataclass(frozen=True)
class TaskSpec:
    """A task to create. Empty task_id means "generate one"."""

    task_id: str = ""
    queue: str = "default"
    priority: int = 0
    input: bytes = b""
    input_digest: str = ""
    requires_review: bool = False
    non_replayable: bool = False
    # Lineage and dependencies (store/lifecycle/tasks.py): empty root and parent make a root task;
    # the thread key is already canonical (domain/lineage.py) or empty.
    root_task_id: str = ""
    parent_task_id: str = ""
    thread_key: str = ""
    depends_on: tuple[str, ...] = ()
    # Retry policy fields the task sets itself ((name, value) pairs of RetryPolicy's fields);
    # the others come from its queue's default, else the server's.
    retry: tuple[tuple[str, Any], ...] = ()
    # Not handed out before this time (epoch seconds; 0: at once).
    not_before: float = 0.0
    # Seconds from creation after which the task is FAILED (TIMED_OUT) whatever runs (0: none).
    schedule_to_close: float = 0.0


@dataclass(frozen=True)
class ClaimResult:
    """Outcome of Claim/ClaimNext; ``fence`` is set only when the outcome is CLAIMED."""

    verdict: Verdict
    fence: Fence | None = None
    task: TaskRecord | None = None
    attempt: int = 0
    ttl: int = 0
    lease_expires_at: float = 0.0
    deadline: float = 0.0
    # Seconds the lease had left when the claim was decided (a reused lease has less than ttl).
    lease_remaining: float = 0.0
    # The last checkpoint an earlier attempt of this task revision left (b"": none).
    checkpoint: bytes = b""
    # The task's place in the ready index before this claim (0: it was not READY, a takeover):
    # a claim given back undelivered (store/attempts/give_back.py) returns it there, not to the end.
    ready_seq: int = 0


class Caller(Protocol):
    """The call a claim answers, as the store sees it (the server adapts gRPC's context): a
    claim is given back when its caller is gone (store/attempts/give_back.py)."""

    def alive(self) -> bool:
        """Whether the answer can still reach the caller (it is there and the server is not
        ending the call)."""
        ...

    def confirm(self) -> None:
        """Check the caller's credentials afresh (a long poll that won a task): raises the
        refusal (Unauthenticated, PermissionDenied) if they were revoked since the call began."""
        ...

    def on_end(self, callback: Callable[[], None]) -> bool:
        """Have ``callback`` called (on another thread, promptly) when the call ends, however
        it ends; False, and no call, when it has ended already."""
        ...

    def answer_lost(self) -> bool:
        """Once the call ended: whether its answer never went out (gRPC saw the caller cancel,
        or its deadline pass, before the answer was sent). False when it cannot tell."""
        ...

    def replayable(self) -> bool:
        """Whether a retry of the call is answered with this call's answer (an idempotency
        key): then a lost answer is recovered by the retry, not given back."""
        ...


@dataclass(frozen=True)
class RenewResult:
    """Outcome of Renew; the times are set when the outcome is OK."""

    verdict: Verdict
    ttl: int = 0
    lease_expires_at: float = 0.0
    deadline: float = 0.0
    checkpoint_refused: str = ""
    """Why the renewal's new checkpoint was not kept (the space guard); "" when it was."""


@dataclass(frozen=True)
class StagingResult:
    """Outcome of StageResult; ``current`` tells whether the attempt still holds the claim."""

    verdict: Verdict
    current: bool = False


@dataclass(frozen=True)
class CommitResult:
    """Outcome of Commit; ``result_commit_id`` and ``state`` are set when COMMITTED."""

    verdict: Verdict
    result_commit_id: str = ""
    state: TaskState | None = None


@dataclass(frozen=True)
class DrainStatus:
    """What still runs (of one queue's tasks when ``queue`` is set); drained when claims are
    paused (globally, or that queue) and every count is zero."""

    epoch: int
    claims_paused: bool
    active_leases: int
    unknown_effects: int
    staged_uncommitted: int
    queue: str = ""
    queue_paused: bool = False

    @property
    def drained(self) -> bool:
        """Whether it is safe to switch pools (of that queue)."""
        return (
            (self.claims_paused or self.queue_paused)
            and self.active_leases == 0
            and self.unknown_effects == 0
            and self.staged_uncommitted == 0
        )


@dataclass(frozen=True)
class FailResult:
    """Outcome of Fail; ``state`` (where the task went) and ``next_eligible_at`` (when it may be
    claimed again; 0 for FAILED) are set when the outcome is OK."""

    verdict: Verdict
    state: TaskState | None = None
    next_eligible_at: float = 0.0


@dataclass(frozen=True)
class Neighbours:
    """A task's place in the dependency graph: its upstreams in depends_on order (a pruned one
    as its tombstone's stand-in, its id in ``pruned``) and one page of its dependents."""

    upstreams: list[TaskRecord]
    pruned: frozenset[str]
    dependents: list[TaskRecord]
    next_page_token: str
