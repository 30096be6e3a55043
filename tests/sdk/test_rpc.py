"""Rpc.call without a server: tries, backoff, the retry window and error mapping against a
scripted method.

The first try of a call runs outside the retry machinery; these tests pin down that it still
counts as the first of the policy's attempts, for the number of tries and for the backoff, and
that the retry window (budget, lease) is measured from it, on an injected clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import tenacity

from coordinator import __version__, request_ids
from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.errors import CoordinatorError, NotFound, PermissionDenied
from coordinator.sdk import PRINCIPAL_METADATA, CallRetry, Claim, OutcomeUnknown, TransportError
from coordinator.sdk._budget import MIN_TRY_TIMEOUT
from coordinator.sdk._core.calls import SDK_VERSION_METADATA, Tries
from coordinator.sdk._rpc import Rpc
from coordinator.sdk._status import ATTEMPT_HINT, NO_COORDINATOR_HINT, REPEAT_HINT
from coordinator.v1 import tasks_pb2, types_pb2, worker_pb2
from tests.helpers import as_unary

POLICY = CallRetry(
    timeout=timedelta(seconds=3),
    attempts=4,
    initial_backoff=timedelta(milliseconds=100),
    max_backoff=timedelta(milliseconds=250),
)


# How gRPC fails a call it had no connection for (the request never left).
NOT_SENT = "failed to connect to all addresses; last error: Connection refused"


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "scripted") -> None:
        super().__init__()
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Clock:
    """A monotonic clock that only the retries' backoff sleeps move."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class Scripted:
    """A unary method that raises the scripted codes (or errors) in turn, then answers "ok";
    with a ``clock``, it also records when each try started."""

    def __init__(self, *codes: grpc.StatusCode | _Failed, clock: Clock | None = None) -> None:
        self._codes = list(codes)
        self._clock = clock
        self.tries: list[tuple[float, tuple[tuple[str, str], ...]]] = []
        self.started: list[float] = []

    def __call__(self, request: Any, *, timeout: float, metadata: Any) -> str:
        self.tries.append((timeout, metadata))
        if self._clock is not None:
            self.started.append(self._clock())
        if self._codes:
            code = self._codes.pop(0)
            raise code if isinstance(code, _Failed) else _Failed(code)
        return "ok"


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The backoff sleeps of the retries, recorded instead of slept."""
    slept: list[float] = []
    monkeypatch.setattr(tenacity.nap, "time", SimpleNamespace(sleep=slept.append))
    return slept


@pytest.fixture
def rpc() -> Iterator[Rpc]:
    """An Rpc with POLICY; its channel is never used."""
    channel = Rpc("127.0.0.1:1", principal="w1", retry=POLICY)
    try:
        yield channel
    finally:
        channel.close()


UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def test_transport_failures_are_retried_with_backoff_from_the_first_try(
    rpc: Rpc, sleeps: list[float]
) -> None:
    method = Scripted(UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, UNAVAILABLE)
    assert rpc.call(as_unary(method), None, idempotency_key="k1") == "ok"
    assert len(method.tries) == 4
    # initial, 2x, then capped at max_backoff; each plus up to one initial of jitter.
    assert len(sleeps) == 3
    for slept, base in zip(sleeps, (0.1, 0.2, 0.25), strict=True):
        assert base <= slept <= base + 0.1
    # Every try is the same call: same deadline, principal, version, request id and key.
    assert len(set(method.tries)) == 1
    timeout, metadata = method.tries[0]
    sent = dict(metadata)
    assert timeout == 3.0
    assert sent[PRINCIPAL_METADATA] == "w1" and sent[SDK_VERSION_METADATA] == __version__
    assert request_ids.is_valid(sent[request_ids.METADATA_KEY])
    assert sent[IDEMPOTENCY_METADATA_KEY] == "k1"


def test_tries_stop_at_the_policys_attempts(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(*[UNAVAILABLE] * 10)
    with pytest.raises(TransportError) as raised:
        rpc.call(as_unary(method), None)
    assert raised.value.code == "UNAVAILABLE"
    assert isinstance(raised.value.__cause__, _Failed)
    assert (len(method.tries), len(sleeps)) == (4, 3)


def test_without_retry_a_transport_failure_is_final(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE)
    with pytest.raises(TransportError):
        rpc.call(as_unary(method), None, retry=False, timeout=0.5)
    assert method.tries[0][0] == 0.5
    assert (len(method.tries), sleeps) == (1, [])


def test_one_attempt_means_no_retry(sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE)
    once = Rpc("127.0.0.1:1", principal="w1", retry=CallRetry(attempts=1))
    try:
        with pytest.raises(TransportError):
            once.call(as_unary(method), None)
    finally:
        once.close()
    assert (len(method.tries), sleeps) == (1, [])


def test_other_errors_are_mapped_and_never_retried(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(grpc.StatusCode.NOT_FOUND)
    with pytest.raises(NotFound, match="NOT_FOUND: scripted"):
        rpc.call(as_unary(method), None)
    assert (len(method.tries), sleeps) == (1, [])


def test_a_retry_answered_with_another_error_is_final(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED)
    with pytest.raises(PermissionDenied, match="PERMISSION_DENIED: scripted"):
        rpc.call(as_unary(method), None)
    assert (len(method.tries), len(sleeps)) == (2, 1)


ABORTED = grpc.StatusCode.ABORTED


def test_a_keyed_call_retries_its_duplicate_refused_while_the_first_try_runs(
    rpc: Rpc, sleeps: list[float]
) -> None:
    # UNAVAILABLE: the answer was lost; ABORTED: the retry met the first try still running
    # (server/interceptors/idempotency.py); then the stored answer. The tries say how many
    # were made.
    method, tries = Scripted(UNAVAILABLE, ABORTED), Tries()
    assert rpc.call(as_unary(method), None, idempotency_key="k1", tries=tries) == "ok"
    assert (len(method.tries), tries.count, len(sleeps)) == (3, 3, 2)
    assert {dict(metadata)[IDEMPOTENCY_METADATA_KEY] for _, metadata in method.tries} == {"k1"}


def test_a_keyed_call_given_up_on_aborted_is_an_unknown_outcome(
    rpc: Rpc, sleeps: list[float]
) -> None:
    method = Scripted(*[ABORTED] * 10)
    with pytest.raises(OutcomeUnknown, match="ABORTED: scripted; outcome unknown, not failed"):
        rpc.call(as_unary(method), None, idempotency_key="k1")
    assert (len(method.tries), len(sleeps)) == (4, 3)


def test_an_unkeyed_aborted_is_final(rpc: Rpc, sleeps: list[float]) -> None:
    method, tries = Scripted(ABORTED), Tries()
    with pytest.raises(CoordinatorError, match="ABORTED: scripted") as raised:
        rpc.call(as_unary(method), None, tries=tries)
    assert not isinstance(raised.value, TransportError)
    assert (len(method.tries), tries.count, sleeps) == (1, 1, [])


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """A fake clock the retries' backoff sleeps advance instead of sleeping."""
    fake = Clock()
    monkeypatch.setattr(tenacity.nap, "time", SimpleNamespace(sleep=fake.sleep))
    return fake


def windowed(clock: Clock, **policy: Any) -> Rpc:
    """An Rpc on ``clock`` with fast backoff and no cap on the number of tries."""
    policy.setdefault("initial_backoff", timedelta(milliseconds=100))
    policy.setdefault("max_backoff", timedelta(milliseconds=250))
    return Rpc("127.0.0.1:1", principal="w1", retry=CallRetry(**policy), clock=clock)


def test_the_budget_not_a_count_bounds_the_retries(clock: Clock) -> None:
    rpc = windowed(clock, budget=timedelta(seconds=3))
    method = Scripted(*[UNAVAILABLE] * 100, clock=clock)
    try:
        with pytest.raises(OutcomeUnknown) as raised:
            rpc.call(as_unary(method), None)
    finally:
        rpc.close()
    # Tries go on for the whole budget (the old count of 5 ended after about a second)...
    assert len(method.tries) > 10
    assert method.started[-1] < 3.0
    # ...and stop without sleeping past it: the next try would have started at 3 s or later.
    assert clock.now == method.started[-1]
    # Not sooner either: the next backoff is at most max_backoff plus one initial of jitter.
    assert clock.now >= 3.0 - 0.25 - 0.1
    assert str(raised.value).endswith(f"outcome unknown, not failed; {REPEAT_HINT}")
    assert raised.value.code == "UNAVAILABLE"


def test_a_call_behind_a_fence_stops_when_the_lease_ends(clock: Clock) -> None:
    rpc = windowed(clock, budget=timedelta(seconds=15))
    method = Scripted(*[grpc.StatusCode.DEADLINE_EXCEEDED] * 100, clock=clock)
    try:
        with pytest.raises(OutcomeUnknown) as raised:
            rpc.call(as_unary(method), None, lease_left=timedelta(seconds=1))
    finally:
        rpc.close()
    assert len(method.tries) > 2
    assert method.started[-1] < 1.0
    assert "outcome unknown, not failed; retry the same call on the same attempt" in str(
        raised.value
    )
    assert str(raised.value).endswith(ATTEMPT_HINT)


def test_a_retry_gets_at_most_what_is_left_of_the_window(clock: Clock) -> None:
    rpc = windowed(clock, timeout=timedelta(seconds=3), budget=timedelta(seconds=1))
    method = Scripted(*[UNAVAILABLE] * 100, clock=clock)
    try:
        with pytest.raises(OutcomeUnknown):
            rpc.call(as_unary(method), None)
    finally:
        rpc.close()
    timeouts = [timeout for timeout, _ in method.tries]
    assert timeouts[0] == 3.0  # the first try is the policy's, as before any failure
    for (timeout, _), started in zip(method.tries[1:], method.started[1:], strict=True):
        assert timeout == max(1.0 - started, MIN_TRY_TIMEOUT)


def test_a_call_no_try_of_which_left_is_a_plain_transport_error(clock: Clock) -> None:
    rpc = windowed(clock, budget=timedelta(seconds=1))
    never = Scripted(*[_Failed(UNAVAILABLE, NOT_SENT)] * 100, clock=clock)
    once = Scripted(UNAVAILABLE, *[_Failed(UNAVAILABLE, NOT_SENT)] * 100, clock=clock)
    try:
        with pytest.raises(TransportError) as nothing_sent:
            rpc.call(as_unary(never), None)
        # One try that may have landed makes the whole call's outcome unknown.
        with pytest.raises(OutcomeUnknown):
            rpc.call(as_unary(once), None)
        with pytest.raises(TransportError) as refused_once:
            rpc.call(as_unary(Scripted(_Failed(UNAVAILABLE, NOT_SENT))), None, retry=False)
    finally:
        rpc.close()
    assert type(nothing_sent.value) is TransportError
    assert str(nothing_sent.value).endswith("no try reached a coordinator" + NO_COORDINATOR_HINT)
    assert len(never.tries) > 2
    assert type(refused_once.value) is TransportError


def test_an_unknown_outcome_without_retries_says_so_too(rpc: Rpc, sleeps: list[float]) -> None:
    method = Scripted(UNAVAILABLE)
    with pytest.raises(OutcomeUnknown, match="outcome unknown, not failed; claim again"):
        rpc.call(as_unary(method), None, retry=False, hint="claim again")
    assert (len(method.tries), sleeps) == (1, [])


def _claim(rpc: Rpc, clock: Clock, ttl: int) -> Claim:
    response = worker_pb2.ClaimResponse(
        outcome=types_pb2.OUTCOME_CLAIMED,
        fence=types_pb2.Fence(task_id="t1", attempt_id="a1", claim_generation=7),
        attempt=1,
        ttl_seconds=ttl,
    )
    return Claim(rpc, response, sent_at=clock.now, clock=clock)


def test_a_commit_is_retried_for_its_whole_budget_past_its_lease(clock: Clock) -> None:
    """The fence decides a late commit (FENCED after a takeover), so the local lease view does
    not cut its retries short: an outage longer than what was left of the lease threw finished
    work away although etcd still held the lease (it keeps leases across its own restart)."""
    rpc = windowed(clock, budget=timedelta(seconds=60))
    commit = Scripted(*[UNAVAILABLE] * 1000, clock=clock)
    claim = _claim(rpc, clock, ttl=10)
    clock.now = 8.5  # 1.5 s of the lease left by the claim's own clock
    rpc.worker = SimpleNamespace(Commit=commit)  # type: ignore[assignment]
    try:
        with pytest.raises(OutcomeUnknown, match=ATTEMPT_HINT):
            claim.commit(b"result")
    finally:
        rpc.close()
    assert commit.started[0] == 8.5 and commit.started[-1] > 10.0  # on past the lease ...
    assert commit.started[-1] < 8.5 + 60  # ... until the budget
    assert not claim.committed and claim.lost_reason is None


def test_a_replica_at_its_concurrency_bound_is_retried_and_never_an_unknown_outcome(
    clock: Clock,
) -> None:
    rpc = windowed(clock, budget=timedelta(seconds=1))
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    burst = Scripted(exhausted, exhausted, clock=clock)
    always = Scripted(*[exhausted] * 100, clock=clock)
    try:
        assert rpc.call(as_unary(burst), None) == "ok"
        with pytest.raises(TransportError) as refused:
            rpc.call(as_unary(always), None)
    finally:
        rpc.close()
    assert len(burst.tries) == 3
    assert len(always.tries) > 2
    # The replica ran none of the tries, so the outcome is known: nothing happened. It did
    # answer every one, so the error does not send the user looking for a missing coordinator.
    assert type(refused.value) is TransportError
    assert str(refused.value).endswith("; refused on every try, nothing ran")


def test_a_read_that_may_have_reached_a_coordinator_has_no_unknown_outcome(
    rpc: Rpc, sleeps: list[float]
) -> None:
    """A read changes nothing: a failure that reached a coordinator (its store unavailable)
    says so and to repeat it, not "outcome unknown ... (a create: ...)"; a renewal's says the
    keepalive's next renewal learns it."""
    method = Scripted(UNAVAILABLE, UNAVAILABLE)
    for request in (tasks_pb2.GetTaskRequest(task_id="t"), tasks_pb2.ListTasksRequest()):
        with pytest.raises(TransportError) as raised:
            rpc.call(as_unary(method), request, retry=False)
        assert type(raised.value) is TransportError
        assert str(raised.value) == "UNAVAILABLE: scripted; a read, nothing changed: repeat it"
    renewal = Scripted(UNAVAILABLE)
    with pytest.raises(OutcomeUnknown) as unknown:
        rpc.call(as_unary(renewal), worker_pb2.RenewManyRequest(), retry=False)
    assert str(unknown.value).endswith("outcome unknown, not failed; the next renewal learns it")
