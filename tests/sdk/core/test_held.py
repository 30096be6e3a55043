"""The held claim's bookkeeping without a server (sdk/_core/held.py, sdk/_core/lease.py): a
renewal's answer moves the lease clock, a checkpoint the server did not keep stays pending and
goes with the next renewal, and the refusals are counted and logged at most once a minute."""

from __future__ import annotations

from datetime import timedelta

from structlog.testing import capture_logs

from coordinator.sdk._core.calls import CallRetry
from coordinator.sdk._core.held import HeldClaim
from coordinator.sdk._core.lease import REFUSAL_LOG_INTERVAL
from coordinator.v1 import types_pb2, worker_pb2

REFUSED = "write budget of 'w' is spent; retry after 3.0 s"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Held(HeldClaim):
    def _signal(self, *, lost: bool) -> None:
        pass


def _held(clock: _Clock) -> HeldClaim:
    fence = types_pb2.Fence(task_id="t1", attempt_id="a1", claim_generation=3, scheduler_epoch=1)
    answer = worker_pb2.ClaimResponse(
        outcome=types_pb2.OUTCOME_CLAIMED, fence=fence, attempt=1, ttl_seconds=9
    )
    return _Held(answer, sent_at=clock.now, on_lost=None, safety_margin=None, clock=clock)


def _renew(claim: HeldClaim, clock: _Clock, refused: str = "") -> worker_pb2.RenewRequest:
    """One renewal of ``claim`` at the clock's time, answered OK (``refused``: its checkpoint
    not kept); the request it sent."""
    request, _ = claim.renewal_request(CallRetry())
    answer = worker_pb2.RenewResponse(
        outcome=types_pb2.OUTCOME_OK, ttl_seconds=9, checkpoint_refused=refused
    )
    assert claim.renewed(clock.now, answer, request)
    return request


def test_a_refused_checkpoint_stays_pending_and_goes_with_the_next_renewal() -> None:
    clock = _Clock()
    claim = _held(clock)
    claim.checkpoint(b"step-1")
    first = _renew(claim, clock, refused=REFUSED)
    assert first.checkpoint == b"step-1"
    assert (claim.checkpoint_refusals, claim.last_checkpoint_refusal) == (1, REFUSED)
    assert claim.checkpoint_pending and claim.renewals == 1
    clock.now += 3
    second = _renew(claim, clock)  # kept this time
    assert second.checkpoint == b"step-1"
    assert not claim.checkpoint_pending
    assert claim.checkpoint_refusals == 1  # what was refused stays counted
    third = _renew(claim, clock)
    assert not third.HasField("checkpoint")  # nothing new: not sent again


def test_only_the_latest_checkpoint_is_pending_and_a_kept_older_one_does_not_clear_it() -> None:
    clock = _Clock()
    claim = _held(clock)
    claim.checkpoint(b"step-1")
    request, _ = claim.renewal_request(CallRetry())
    claim.checkpoint(b"step-2")  # recorded while step-1's renewal is in flight
    answer = worker_pb2.RenewResponse(outcome=types_pb2.OUTCOME_OK, ttl_seconds=9)
    assert claim.renewed(clock.now, answer, request)
    assert claim.checkpoint_pending
    assert _renew(claim, clock).checkpoint == b"step-2"
    assert not claim.checkpoint_pending


def test_a_renewal_restores_the_lease_from_its_send() -> None:
    clock = _Clock()
    claim = _held(clock)
    clock.now += 6
    assert claim.remaining() == timedelta(seconds=3)
    _renew(claim, clock)
    assert claim.remaining() == timedelta(seconds=9)


def test_refusals_are_logged_at_most_once_per_interval() -> None:
    clock = _Clock()
    claim = _held(clock)
    claim.checkpoint(b"step-1")
    with capture_logs() as logs:
        for _ in range(5):
            _renew(claim, clock, refused=REFUSED)
            clock.now += 3
        clock.now += REFUSAL_LOG_INTERVAL
        _renew(claim, clock, refused=REFUSED)
    lines = [e for e in logs if e["event"].startswith("checkpoint not kept")]
    assert [e["refusals"] for e in lines] == [1, 6]
    assert claim.checkpoint_refusals == 6 and claim.checkpoint_pending
