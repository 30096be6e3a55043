"""What doctor reports: the kinds of problem, a finding, and the guarded repair it may offer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from coordinator.store.etcd.ops import KV


class Problem(StrEnum):
    """Kinds of disagreement (the value is what the report prints)."""

    UNDECODABLE = "undecodable-record"
    TASK_IN_TWO_PLACES = "task-in-two-places"
    READY_KEY_MISSING = "ready-key-missing"
    READY_KEY_ORPHAN = "ready-key-orphan"
    CLAIMED_INDEX_MISSING = "claimed-index-missing"
    CLAIMED_INDEX_ORPHAN = "claimed-index-orphan"
    WAITING_INDEX_MISSING = "waiting-index-missing"
    WAITING_INDEX_ORPHAN = "waiting-index-orphan"
    # The mark indexes of WAITING tasks (coordinator/doctor/marks.py).
    BLOCKED_INDEX_MISSING = "blocked-index-missing"
    BLOCKED_INDEX_ORPHAN = "blocked-index-orphan"
    OVERDUE_INDEX_MISSING = "overdue-index-missing"
    OVERDUE_INDEX_ORPHAN = "overdue-index-orphan"
    CLAIM_KEY_MISMATCH = "claim-key-mismatch"
    CLAIM_EXPIRED_UNRECLAIMED = "claim-expired-unreclaimed"
    ATTEMPT_MISMATCH = "attempt-mismatch"
    RESULT_MISSING = "result-missing"
    RESULT_UNEXPECTED = "result-unexpected"
    RESULT_MISMATCH = "result-mismatch"
    EVENT_CHAIN_BROKEN = "event-chain-broken"
    ORPHAN_RECORDS = "records-of-missing-task"
    # A task record of schema 2 whose input key is gone (coordinator/store/task_inputs.py).
    INPUT_MISSING = "input-missing"
    DEPENDENCY_DANGLING = "dependency-dangling"
    EDGES_MISMATCH = "edges-mismatch"
    REVERSE_EDGE_MISSING = "reverse-edge-missing"
    REVERSE_EDGE_ORPHAN = "reverse-edge-orphan"
    RELEASE_OVERDUE = "release-overdue"
    # A WAITING task whose blocked_by disagrees with its upstreams' states (no releaser wrote
    # the mark yet).
    BLOCKED_MARK_OVERDUE = "blocked-mark-overdue"
    IDENTITY_INDEX_MISSING = "identity-index-missing"
    IDENTITY_INDEX_ORPHAN = "identity-index-orphan"
    OPEN_EFFECT_INDEX_MISSING = "open-effect-index-missing"
    OPEN_EFFECT_INDEX_ORPHAN = "open-effect-index-orphan"
    RECONCILE_INDEX_MISSING = "reconcile-index-missing"
    RECONCILE_INDEX_ORPHAN = "reconcile-index-orphan"
    # The indexes sorted by time (coordinator/doctor/due_indexes.py).
    DELAYED_KEY_MISSING = "delayed-key-missing"
    DELAYED_KEY_MISMATCH = "delayed-key-mismatch"
    DELAYED_KEY_ORPHAN = "delayed-key-orphan"
    DEADLINE_KEY_MISSING = "deadline-key-missing"
    DEADLINE_KEY_MISMATCH = "deadline-key-mismatch"
    DEADLINE_KEY_ORPHAN = "deadline-key-orphan"
    # Retention (coordinator/doctor/retention.py).
    PRUNE_LEFTOVER = "records-of-pruned-task"
    TASK_AND_TOMBSTONE = "task-and-tombstone"
    TERMINAL_NOT_SCHEDULED = "terminal-task-not-in-prune-index"
    PRUNE_INDEX_ORPHAN = "prune-index-orphan"
    TASK_EFFECT_INDEX_MISSING = "task-effect-index-missing"


LAGGING = frozenset(
    {Problem.CLAIM_EXPIRED_UNRECLAIMED, Problem.RELEASE_OVERDUE, Problem.BLOCKED_MARK_OVERDUE}
)
"""Findings that only count when they persist across the reclaim window."""


@dataclass(frozen=True)
class Guard:
    """A repair's precondition: ``key``'s mod_revision is exactly this (0: the key is absent)."""

    key: str
    mod_revision: int


@dataclass(frozen=True)
class RepairWrite:
    """A repair's write: put ``value`` (None: delete the key)."""

    key: str
    value: bytes | None


@dataclass(frozen=True)
class Repair:
    """One unambiguous fix, applied as one txn: all guards hold, then all writes."""

    action: str
    guards: tuple[Guard, ...]
    writes: tuple[RepairWrite, ...]


@dataclass(frozen=True)
class Finding:
    """One disagreement."""

    problem: Problem
    task_id: str
    message: str
    keys: tuple[str, ...] = ()
    repair: Repair | None = None
    # For lagging findings: the task's state_version, to tell "still stuck" from "moved on".
    state_version: int = 0


@dataclass
class Snapshot:
    """Every key under a prefix, read at one revision."""

    revision: int
    kvs: Mapping[str, KV]
