"""Effects and managed jobs use a claim only through HeldAttempt (sdk/_core/attempt.py): its fence,
calls behind it, marking it lost, and the effect keys it sent.

They are driven here through an attempt that is not a Claim (it forwards the protocol to one), so
a helper that reached into Claim's private parts, or kept its state elsewhere, would fail.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from coordinator.domain.decisions import Fence
from coordinator.domain.jobs import JobState
from coordinator.domain.states import FenceReason, Outcome
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import (
    CallRetry,
    Claim,
    ClaimLost,
    DownstreamResult,
    Duration,
    EffectStatus,
    LossSource,
)
from coordinator.sdk._core.attempt import SentKeys, WorkerMethod
from coordinator.sdk._core.calls import Req, Resp
from coordinator.sdk._jobstart import run_managed
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.effects import run_effect
from tests.conftest import GRPC_OPTIONS
from tests.sdk.support import QUEUE, Served, served


@dataclass
class Forwarding:
    """A HeldAttempt that is not a Claim: it forwards to one and records what went through it."""

    claim: Claim
    calls: list[str] = field(default_factory=list)
    losses: list[tuple[Outcome, FenceReason, LossSource]] = field(default_factory=list)
    sent_keys: SentKeys = field(default_factory=SentKeys)

    @property
    def fence(self) -> Fence:
        return self.claim.fence

    def call(self, method: WorkerMethod[Req, Resp], request: Req) -> Resp:
        self.calls.append(type(request).__name__.removesuffix("Request"))
        return self.claim.call(method, request)

    def check(self, *, margin: Duration | None = None) -> None:
        self.claim.check(margin=margin)

    def mark_lost(
        self, outcome: Outcome, reason: FenceReason, message: str, source: LossSource
    ) -> None:
        self.losses.append((outcome, reason, source))
        self.claim.mark_lost(outcome, reason, message, source)


@dataclass
class Recording:
    """A downstream that performs every call and remembers the keys."""

    executed: list[str] = field(default_factory=list)

    def execute(self, idempotency_key: str, generation: int, payload: bytes) -> DownstreamResult:
        self.executed.append(idempotency_key)
        return DownstreamResult(f"msg-{len(self.executed)}")

    def lookup(self, idempotency_key: str, generation: int) -> DownstreamResult | None:
        raise AssertionError("nothing was sent before: no lookup")


@pytest.fixture
def coordinator(etcd: EtcdProcess, prefix: str) -> Iterator[Served]:
    with served(etcd.endpoint, prefix) as running:
        yield running


@pytest.fixture
def attempt(coordinator: Served) -> Iterator[Forwarding]:
    """Task t1, claimed by worker A, behind a Forwarding attempt."""
    with coordinator.client("pm") as pm:
        pm.create_task("t1", input=b"input", queue=QUEUE)
    with coordinator.client("A") as a:
        claim = a.claim("t1", ttl=timedelta(seconds=30))
        assert isinstance(claim, Claim)
        yield Forwarding(claim)


def cancel(coordinator: Served) -> None:
    with coordinator.client("pm") as pm:
        pm.cancel_task("t1", reason="not needed")


def test_an_effect_goes_through_the_attempt_and_its_key_stays_on_it(
    coordinator: Served, attempt: Forwarding
) -> None:
    key = coordinator.effect_id("t1", "notify", "email")
    down = Recording()
    outcome = run_effect(attempt, "notify", "email", b"hello", down)
    assert (outcome.status, outcome.sent, outcome.effect_id) == (EffectStatus.EXECUTED, True, key)
    assert attempt.calls == ["PrepareEffect", "RecordEffect"]
    assert down.executed == [key]
    assert attempt.sent_keys.first_send(key) is False  # this attempt's ledger has it
    assert attempt.claim.sent_keys.first_send(key) is True  # the Claim's own ledger is another
    assert attempt.losses == []


def test_a_refused_effect_marks_the_attempt_lost(coordinator: Served, attempt: Forwarding) -> None:
    cancel(coordinator)
    outcome = run_effect(attempt, "notify", "email", b"hello", Recording())
    assert (outcome.status, outcome.sent, outcome.outcome) == (
        EffectStatus.FENCED,
        False,
        Outcome.CANCELLED,
    )
    assert attempt.losses == [(Outcome.CANCELLED, FenceReason.NONE, LossSource.EFFECT)]
    lost = attempt.claim.lost_reason
    assert lost is not None and (lost.outcome, lost.source) == (
        Outcome.CANCELLED,
        LossSource.EFFECT,
    )


@pytest.fixture
def rpc(coordinator: Served) -> Iterator[Rpc]:
    """The channel a managed job records its end with (FinishJob carries no fence)."""
    channel = Rpc(
        coordinator.target, principal="A", retry=CallRetry(), channel_options=GRPC_OPTIONS
    )
    yield channel
    channel.close()


def test_a_managed_job_starts_through_the_attempt(
    attempt: Forwarding, rpc: Rpc, tmp_path: Path
) -> None:
    process = run_managed(attempt, rpc, ["true"], log_dir=tmp_path)
    result = process.wait(timedelta(seconds=30))
    assert result is not None
    assert (result.state, result.exit_code, result.recorded) == (JobState.EXITED, 0, True)
    assert attempt.calls == ["StartJob"]
    assert attempt.losses == []


def test_a_refused_managed_start_marks_the_attempt_lost(
    coordinator: Served, attempt: Forwarding, rpc: Rpc, tmp_path: Path
) -> None:
    cancel(coordinator)
    with pytest.raises(ClaimLost, match="not started: StartJob answered CANCELLED"):
        run_managed(attempt, rpc, ["true"], log_dir=tmp_path)
    assert attempt.calls == ["StartJob"]
    assert attempt.losses == [(Outcome.CANCELLED, FenceReason.NONE, LossSource.JOB)]
    assert attempt.claim.is_lost()


def test_only_the_first_send_of_a_key_counts_even_when_racing() -> None:
    keys = SentKeys()
    start = threading.Barrier(8)

    def race(_: int) -> bool:
        start.wait()
        return keys.first_send("k")

    with ThreadPoolExecutor(8) as pool:
        firsts = list(pool.map(race, range(8)))
    assert firsts.count(True) == 1
    assert keys.first_send("k") is False
    assert keys.first_send("other") is True
