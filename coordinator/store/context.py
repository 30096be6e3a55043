"""What every store module shares: the etcd adapter, the key layout, the limits and the clock,
plus decoding of stored records with their etcd-assigned revisions."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from coordinator.clock import Clock
from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import AttemptRecord, ClaimRecord, TaskRecord, decode, with_changes
from coordinator.domain.retention import RetentionPolicy
from coordinator.domain.states import TaskState
from coordinator.metrics import METRICS, Metrics
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.leases import ClaimLeases
from coordinator.store.etcd.ops import KV
from coordinator.store.etcd.step_io import SyncStepIO


@dataclass(frozen=True)
class StoreContext:
    """The dependencies of every store operation."""

    kv: EtcdKV
    keys: Keyspace
    limits: ClaimLimits
    clock: Clock
    leases: ClaimLeases
    # Read by the txn that makes a task terminal (store/retention_index.py) and by the pruner.
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    # Where every count of the store goes (a test passes a fresh registry's).
    metrics: Metrics = METRICS
    # Why the keyspace's version record refuses this replica now, None while it admits it: the
    # background loops and a waiting long poll ask before each unit of work
    # (store/control/versions.py ``Standing``; Store.open wires it, a bare context is always
    # admitted).
    refusal: Callable[[], str | None] = field(default=lambda: None)
    # Whether this replica may write a schema's layout now (``Standing.writes_schema``): a
    # bare context writes the first schema's only.
    writes_schema: Callable[[int], bool] = field(default=lambda schema: False)

    def admitted(self) -> bool:
        """Whether the version record admits this replica (``refusal`` is None)."""
        return self.refusal() is None

    @cached_property
    def io(self) -> SyncStepIO:
        """``kv`` and ``leases`` as the sync ``StepIO`` a store coroutine awaits
        (store/etcd/step_io.py)."""
        return SyncStepIO(self.kv, self.leases)


def task_from_kv(kv: KV) -> TaskRecord:
    """Decode a task; while CLAIMED its generation is the claim txn's revision (mod_revision);
    its incarnation (created_revision) is the key's create_revision."""
    task = decode(
        TaskRecord, kv.value, state_version=kv.mod_revision, created_revision=kv.create_revision
    )
    if task.state is TaskState.CLAIMED and task.claim_generation == 0:
        task = with_changes(task, claim_generation=kv.mod_revision)
    return task


def claim_from_kv(kv: KV) -> ClaimRecord:
    """Decode a live claim; its generation is the claim key's create_revision."""
    return decode(
        ClaimRecord, kv.value, generation=kv.create_revision, mod_revision=kv.mod_revision
    )


def attempt_from_kv(kv: KV) -> AttemptRecord:
    """Decode an attempt; a running one's generation is its key's create_revision."""
    attempt = decode(AttemptRecord, kv.value, mod_revision=kv.mod_revision)
    if attempt.claim_generation == 0:
        attempt = with_changes(attempt, claim_generation=kv.create_revision)
    return attempt


def attempt_of(task: TaskRecord, attempt_id: str, kv: KV | None) -> AttemptRecord | None:
    """Attempt ``attempt_id`` of ``task``: from its key ``kv`` if it has one (a key always
    wins: a checkpoint writes one while the record still describes the attempt), else as the
    task record describes its current attempt (schema 3, ``TaskRecord.attempt_in_record``),
    else None."""
    if kv is not None:
        return attempt_from_kv(kv)
    recorded = recorded_attempt(task)
    return recorded if recorded is not None and recorded.attempt_id == attempt_id else None


def epoch_from_kv(kv: KV | None) -> int:
    """The scheduler epoch; an uninitialised keyspace is at epoch 1."""
    return int(kv.value) if kv is not None else 1


def new_attempt_id(attempt: int) -> str:
    """A fresh attempt id: the attempt number plus randomness (never reused)."""
    return f"a{attempt}-{secrets.token_hex(6)}"


def new_task_id() -> str:
    """A generated task id."""
    return f"t-{secrets.token_hex(8)}"
