"""``claim.effect`` end to end: a real coordinator on the session etcd, a real outbox process.

Each test asserts on the outbox's own count of performed calls per key: the number the whole
protocol exists to keep at one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from coordinator.demo.outbox import OutboxProcess
from coordinator.domain.digests import digest_of
from coordinator.domain.states import Op
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import (
    Claim,
    ClaimRefused,
    DownstreamResult,
    EffectState,
    EffectStatus,
    FenceReason,
    HttpDownstream,
    Outcome,
    TaskState,
    WorkerClient,
)
from tests.helpers import eventually
from tests.sdk.support import QUEUE, Served, served
from tests.store.support import events

X, Y = b"to: ops\n\nthe report is ready (draft X)", b"to: ops\n\nthe report is ready (draft Y)"
TTL = timedelta(seconds=1)  # etcd grants 2 s


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def outbox() -> Iterator[OutboxProcess]:
    with OutboxProcess() as running:
        yield running


def create(coordinator: Served, *, non_replayable: bool = False) -> str:
    """Create t1; the effect id of its slot notify/email (the downstream's key)."""
    with coordinator.client("pm") as pm:
        pm.create_task("t1", input=b"input", queue=QUEUE, non_replayable=non_replayable)
    return coordinator.effect_id("t1", "notify", "email")


def take_over(client: WorkerClient) -> Claim:
    """Claim t1 as soon as the previous holder's lease is gone."""

    def attempt() -> Claim | None:
        claim = client.claim("t1", ttl=timedelta(seconds=30))
        return claim if isinstance(claim, Claim) else None

    return eventually(attempt, timeout=15, message="t1 never became claimable")


def test_unknown_then_absent_then_sent_once_and_the_late_owner_is_fenced(
    coordinator: Served, outbox: OutboxProcess
) -> None:
    key = create(coordinator)
    with coordinator.client("A") as a, coordinator.client("B") as b:
        job_a = a.claim("t1", ttl=TTL)
        assert isinstance(job_a, Claim)
        # A's call is held by the downstream before it is performed; A gives up: UNKNOWN.
        outbox.stall(key)
        lost = job_a.effect("notify", "email", X, HttpDownstream(outbox.url, timeout=0.5))
        assert (lost.status, lost.effect_id, lost.sent, lost.recorded) == (
            EffectStatus.UNCERTAIN,
            key,
            True,
            True,
        )
        assert a.get_effect(key).state is EffectState.UNKNOWN

        # A's lease runs out (no keepalive); B takes over, looks the key up (absent), records
        # ABSENT, and sends X with the same key: performed once.
        job_b = take_over(b)
        assert job_b.generation > job_a.generation
        done = job_b.effect("notify", "email", X, HttpDownstream(outbox.url))
        assert (done.status, done.effect_id, done.sent) == (EffectStatus.EXECUTED, key, True)
        assert outbox.performed(key) == 1
        counts = outbox.counts()
        assert counts["lookups"] == {key: 1}
        effect = b.get_effect(key)
        assert (effect.state, effect.external_ref) == (EffectState.COMMITTED, done.external_ref)
        assert effect.prepared_generation == job_b.generation

        # A's held call finally reaches the downstream: its generation is below the floor B's
        # lookup set, so it is refused, not performed.
        outbox.release(key)
        eventually(lambda: outbox.counts()["calls"].get(key) == 2, timeout=10)
        assert outbox.performed(key) == 1

        # A returns late: prepare and record with the old generation are FENCED.
        late = job_a.effect("notify", "email", X, HttpDownstream(outbox.url))
        assert (late.status, late.outcome, late.reason, late.sent) == (
            EffectStatus.FENCED,
            Outcome.FENCED,
            FenceReason.SUPERSEDED,
            False,
        )
        assert job_a.is_lost()
        assert job_b.commit(b"the report").committed
    assert outbox.performed(key) == 1
    assert set(outbox.counts()["performed"]) == {key}  # no other key was ever invented


def test_a_committed_slot_is_skipped(coordinator: Served, outbox: OutboxProcess) -> None:
    key = create(coordinator)
    down = HttpDownstream(outbox.url)
    with coordinator.client("A") as a, coordinator.client("B") as b:
        job_a = a.claim("t1", ttl=timedelta(seconds=30))
        assert isinstance(job_a, Claim)
        first = job_a.effect("notify", "email", X, down)
        assert first.status is EffectStatus.EXECUTED and first.done
        assert job_a.release().released
        job_b = take_over(b)
        again = job_b.effect("notify", "email", X, down)
        assert (again.status, again.sent, again.external_ref) == (
            EffectStatus.SKIPPED,
            False,
            first.external_ref,
        )
        other = job_b.effect("notify", "email", Y, down)  # another draft for the same slot
        assert (other.status, other.conflict, other.payload_digest, other.sent) == (
            EffectStatus.SKIPPED,
            True,
            digest_of(X),
            False,
        )
    assert outbox.counts()["calls"] == {key: 1}


def test_a_non_replayable_task_waits_for_approval_then_runs_again(
    coordinator: Served, etcd_client: Any
) -> None:
    key = create(coordinator, non_replayable=True)
    with OutboxProcess(idempotent=False) as plain, coordinator.client("A") as a:
        down = HttpDownstream(plain.url)
        job_a = a.claim("t1", ttl=timedelta(seconds=30))
        assert isinstance(job_a, Claim)
        plain.drop(next=1)  # performed, and the answer is lost
        sent = job_a.effect("notify", "email", X, down)
        assert (sent.status, sent.sent) == (EffectStatus.UNCERTAIN, True)
        # Trying again in the same attempt reconciles; this downstream cannot tell: no send.
        again = job_a.effect("notify", "email", X, down)
        assert (again.status, again.sent) == (EffectStatus.UNCERTAIN, False)
        assert plain.performed(key) == 1
        assert job_a.release("the send timed out").released

        with coordinator.client("B") as b, coordinator.client("ops-anna") as ops:
            refused = b.claim("t1", ttl=timedelta(seconds=30))
            assert isinstance(refused, ClaimRefused)
            assert refused.outcome is Outcome.NEEDS_APPROVAL
            assert b.get_task("t1").state is TaskState.NEEDS_APPROVAL
            nothing = b.claim_next(QUEUE, ttl=timedelta(seconds=30))
            assert isinstance(nothing, ClaimRefused)
            assert nothing.outcome is Outcome.NO_READY_TASK

            task, resolved = ops.admin.approve_retry(
                "t1", resolution=EffectState.COMMITTED, reason="the mail is in the sent folder"
            )
            assert task.state is TaskState.READY
            assert [(e.effect_id, e.state) for e in resolved] == [(key, EffectState.COMMITTED)]
            last = events(coordinator.store, etcd_client, "t1")[-1]
            assert (last.op, last.by) == (Op.APPROVE_RETRY, "ops-anna")

            job_b = b.claim("t1", ttl=timedelta(seconds=30))
            assert isinstance(job_b, Claim)
            skipped = job_b.effect("notify", "email", X, down)
            assert (skipped.status, skipped.sent) == (EffectStatus.SKIPPED, False)
            assert job_b.commit(b"done").committed
        assert plain.performed(key) == 1


@dataclass
class CrashingDownstream:
    """Performs the call, then crashes before returning (an adapter bug, a killed thread)."""

    executed: list[str] = field(default_factory=list)
    looked_up: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        with self.lock:
            self.executed.append(idempotency_key)
        raise RuntimeError("adapter crashed after sending")

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        self.looked_up.append(idempotency_key)
        return DownstreamResult("msg-from-lookup")


def test_one_attempt_never_sends_a_key_twice(coordinator: Served) -> None:
    key = create(coordinator)
    down = CrashingDownstream()
    with coordinator.client("A") as a:
        claim = a.claim("t1", ttl=timedelta(seconds=30))
        assert isinstance(claim, Claim)
        with pytest.raises(RuntimeError, match="crashed"):
            claim.effect("notify", "email", X, down)
        # The coordinator says EXECUTE again (PREPARED by this very generation), but this
        # attempt already sent the key: the SDK looks it up instead.
        found = claim.effect("notify", "email", X, down)
        assert (found.status, found.sent, found.external_ref) == (
            EffectStatus.RECONCILED,
            False,
            "msg-from-lookup",
        )
    assert (down.executed, down.looked_up) == ([key], [key])
