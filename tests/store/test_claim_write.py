"""coordinator.store.claims.claim_txn.claim_write: the claim txn is built from what the claim read,
without I/O (its context has no etcd here: any read would fail)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

import pytest

from coordinator.clock import ManualClock
from coordinator.domain.decisions import Verdict
from coordinator.domain.keys import Keyspace
from coordinator.domain.records import AttemptRecord, ClaimRecord, decode
from coordinator.domain.retry import takeover
from coordinator.domain.states import AttemptEnd, Outcome, TaskState
from coordinator.store.claims.claim_txn import claim_write
from coordinator.store.claims.gates import ClaimRead
from coordinator.store.context import StoreContext
from coordinator.store.etcd.kv import EtcdKV
from coordinator.store.etcd.leases import ClaimLease, ClaimLeases
from tests.domain.samples import ATTEMPT, TASK
from tests.store.support import LIMITS

NOW = 500.0
LEASE = ClaimLease(lease_id=42, ttl=10, remaining=10.0)
NO_ETCD = cast(EtcdKV, None)
CTX = StoreContext(NO_ETCD, Keyspace("/p"), LIMITS, ManualClock(), ClaimLeases(NO_ETCD))
EXPIRED_TASK = TASK  # CLAIMED, naming attempt a1, whose claim key is gone
READY_TASK = replace(TASK, state=TaskState.READY, claim_generation=0)


def _write(read: ClaimRead) -> dict[str, Any]:
    """The txn's puts by key (values as bytes) and its compared keys."""
    write = claim_write(CTX, read, principal="w2", epoch=1, lease=LEASE, attempt_id="a2-x", now=NOW)
    puts = {op.request_put.key.decode(): op.request_put for op in write.ops if op.request_put.key}
    return {"write": write, "puts": puts, "compared": [c.key.decode() for c in write.compares]}


def _read(task: Any, attempt: AttemptRecord | None, *, epoch: int = 1) -> ClaimRead:
    """What the claim read: for a CLAIMED task, a takeover with the scheduler at ``epoch``."""
    took = takeover(task, epoch, NOW) if task.state is TaskState.CLAIMED else None
    return ClaimRead(task, Verdict(Outcome.CLAIMED), (), attempt, takeover=took)


def test_a_takeover_closes_the_attempt_it_read_as_expired() -> None:
    built = _write(_read(EXPIRED_TASK, ATTEMPT))
    closed = decode(AttemptRecord, built["puts"]["/p/attempts/t1/a1"].value)
    assert closed == replace(ATTEMPT, end=AttemptEnd.EXPIRED, ended_at=NOW)
    started = decode(AttemptRecord, built["puts"]["/p/attempts/t1/a2-x"].value)
    assert (started.attempt, started.owner_id, started.end) == (2, "w2", AttemptEnd.RUNNING)


def test_a_takeover_writes_the_retry_decision_on_the_attempt_it_closes() -> None:
    """Its own lease's end: counted, its error the task's last. Fenced by an epoch bump before
    it expired: not counted (the budget begins one attempt later), the last error kept."""
    expired_task = replace(EXPIRED_TASK, last_error="earlier")
    own = _write(_read(expired_task, ATTEMPT))["write"].after
    assert (own.attempts_base, own.last_error) == (expired_task.attempts_base, "lease expired")
    fenced = _write(_read(expired_task, ATTEMPT, epoch=2))["write"].after
    assert (fenced.attempts_base, fenced.last_error) == (expired_task.attempts_base + 1, "earlier")


@pytest.mark.parametrize(
    "read",
    [_read(READY_TASK, ATTEMPT), _read(EXPIRED_TASK, None)],
    ids=["ready-task", "attempt-record-missing"],
)
def test_nothing_is_closed_unless_a_claimed_task_names_an_attempt_that_was_read(
    read: ClaimRead,
) -> None:
    assert "/p/attempts/t1/a1" not in _write(read)["puts"]


def test_the_claim_key_goes_on_the_lease_behind_the_claim_compares() -> None:
    built = _write(_read(READY_TASK, None))
    claim = built["puts"]["/p/claims/t1"]
    assert claim.lease == LEASE.lease_id
    record = decode(ClaimRecord, claim.value)
    assert (record.ttl, record.claimed_at, record.deadline) == (
        LEASE.ttl,
        NOW,
        NOW + LIMITS.max_claim_duration,
    )
    assert built["compared"] == [
        "/p/tasks/t1",
        "/p/claims/t1",
        "/p/epoch",
        "/p/control/claims_paused",
        "/p/control/queue_paused/q",
    ]
    assert built["write"].after.state is TaskState.CLAIMED
