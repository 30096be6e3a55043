"""Sample records for the decision tests: one claim holder, from which each case departs."""

from __future__ import annotations

from coordinator.domain.decisions import Fence, FenceView, Verdict
from coordinator.domain.digests import digest_of
from coordinator.domain.records import AttemptRecord, ClaimRecord, ResultRecord, TaskRecord
from coordinator.domain.states import FenceReason, Outcome, TaskState

GEN = 100
NOW = 50.0
"""The server's clock in the decisions (tasks without a deadline do not read it)."""
D1, D2 = digest_of(b"v1"), digest_of(b"v2")
R1, R2 = digest_of(b"r1"), digest_of(b"r2")
FENCE = Fence("t1", "a1", GEN, 1, 0)
TASK = TaskRecord(
    task_id="t1",
    queue="q",
    input_digest=D1,
    state=TaskState.CLAIMED,
    claim_generation=GEN,
    attempt=1,
    attempt_id="a1",
    owner_id="w1",
    scheduler_epoch=1,
    state_version=GEN,
)
ATTEMPT = AttemptRecord(
    task_id="t1",
    attempt_id="a1",
    attempt=1,
    owner_id="w1",
    revision=1,
    input_digest=D1,
    scheduler_epoch=1,
    ttl=10,
    started_at=0.0,
    claim_generation=GEN,
)
CLAIM = ClaimRecord(
    attempt_id="a1",
    owner_id="w1",
    lease_id=7,
    ttl=10,
    claimed_at=0.0,
    deadline=3600.0,
    stall_timeout=600.0,
    generation=GEN,
)
HOLDER = FenceView(task=TASK, attempt=ATTEMPT, claim=CLAIM, epoch=1)


def result_of(attempt_id: str = "a1", digest: str = R1, generation: int = GEN) -> ResultRecord:
    return ResultRecord("t1", 1, attempt_id, generation, 1, "w1", digest, 0.0)


def pair(verdict: Verdict) -> tuple[Outcome, FenceReason]:
    """Outcome and reason, to compare both at once."""
    return verdict.outcome, verdict.reason
