"""The SDK's transport: one channel, the three service stubs, deadlines, retries.

The decisions are pure and shared with the asyncio transport (coordinator.sdk.aio): the policy
(``CallRetry``), what a status means (sdk/_status.py), and one call's tries (``CallPlan``);
``Rpc`` only sends the tries on a sync channel.

Every call carries the caller's principal in metadata and a deadline. Transport failures
(UNAVAILABLE, DEADLINE_EXCEEDED) and refusals at a replica's concurrency bound
(RESOURCE_EXHAUSTED) are retried with exponential backoff for as long as the call's
time allows (sdk/_budget.py: the retry budget, and the lease for a call behind a claim's fence);
every other status is final and becomes one of the coordinator's exceptions. A call given up
after a try that may have reached a coordinator raises OutcomeUnknown, saying what to repeat.

Why retrying is safe: every worker call is idempotent per attempt. A renew only keeps the same
lease alive; a repeated commit of the same attempt and digest answers COMMITTED again (the
contract says so); a repeated stage overwrites the attempt's own staging key with the same
bytes; authorize writes nothing; a repeated release answers FENCED/RELEASED without a second
transition. A claim is the exception: every Claim / ClaimNext (and Commit with ``next``) carries
an idempotency key of its own, one per logical call, so a retry whose first try landed gets that
try's answer, the same attempt, instead of starting another (ABORTED, the first try still
running, is retried too). Task creation is retried only with an explicit task id or a key.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, cast

import grpc
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_never,
    wait_exponential,
    wait_random,
)
from tenacity.stop import stop_base

from coordinator import __version__, request_ids
from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.errors import CoordinatorError, InvalidArgument
from coordinator.sdk import _budget
from coordinator.sdk._duration import DurationField
from coordinator.sdk._status import (
    ATTEMPT_HINT,
    REPEAT_HINT,
    is_retried,
    is_transport,
    never_sent,
    translate,
)
from coordinator.sdk._target import LB_OPTION, Endpoints, channel_target, endpoint_targets
from coordinator.sdk.abort import Abort, CallAborted
from coordinator.v1 import admin_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc

PRINCIPAL_METADATA = "x-coordinator-principal"
"""The gRPC metadata key that names the calling principal."""

SDK_VERSION_METADATA = "x-coordinator-sdk-version"
"""The gRPC metadata key that names this SDK's version (the server's version gate reads it)."""

# A restarted coordinator is found again within a second, not after gRPC's default backoff
# (which grows to two minutes); callers may override any of these.
_DEFAULT_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    LB_OPTION[0]: LB_OPTION[1],
}

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True)
class CallRetry:
    """Deadlines and transport retries of every SDK call.

    ``budget`` bounds how long one call keeps retrying, from its first try; a call behind a
    claim's fence stops sooner if the lease ends sooner. The default, 15 s, outlasts what a
    coordinator is unreachable for in the ordinary faults: a replica restart (about 1.7 s
    in a soak), the server's 2 s back-off after an etcd error, and an etcd leader election
    (1 s election timeout by default, a few seconds in the worst case), together with margin;
    a longer outage is reported (OutcomeUnknown / TransportError) rather than waited out.
    """

    # Deadline of one try of one call. Every duration here takes seconds too (sdk/_duration.py).
    timeout: DurationField[timedelta] = DurationField(timedelta(seconds=10))
    # How long one call keeps retrying transport failures, its first try included.
    budget: DurationField[timedelta] = DurationField(timedelta(seconds=15))
    # At most this many tries per call, the first included (1: no retries; None: the budget
    # alone bounds them).
    attempts: int | None = None
    initial_backoff: DurationField[timedelta] = DurationField(timedelta(milliseconds=100))
    max_backoff: DurationField[timedelta] = DurationField(timedelta(seconds=2))

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise InvalidArgument(f"CallRetry.attempts must be >= 1, got {self.attempts}")
        if self.timeout <= timedelta(0):
            raise InvalidArgument(f"CallRetry.timeout must be positive, got {self.timeout}")
        if self.budget < timedelta(0):
            raise InvalidArgument(f"CallRetry.budget must not be negative, got {self.budget}")

    @property
    def retries(self) -> bool:
        """Whether a transport failure is tried again at all."""
        return self.attempts != 1 and self.budget > timedelta(0)


class _OutOfTime(stop_base):
    """tenacity's stop: the next try would start after the call's deadline."""

    def __init__(self, deadline: float, clock: Callable[[], float]) -> None:
        self._deadline = deadline
        self._clock = clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        return _budget.out_of_time(self._clock(), retry_state.upcoming_sleep, self._deadline)


def base_metadata(principal: str) -> tuple[tuple[str, str], ...]:
    """What every call of ``principal`` carries: who calls, and this SDK's version."""
    if not principal:
        raise InvalidArgument("principal must not be empty")
    return ((PRINCIPAL_METADATA, principal), (SDK_VERSION_METADATA, __version__))


def channel_options_of(options: Sequence[tuple[str, Any]] | None) -> list[tuple[str, Any]]:
    """The SDK's channel defaults with the caller's ``options`` over them."""
    return list({**_DEFAULT_CHANNEL_OPTIONS, **dict(options or ())}.items())


class Tries:
    """How many tries one call took, for a caller that asks (``Rpc.call(..., tries=...)``): a
    keyed claim answered by a retry may carry an earlier try's grant, made before it was sent."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class CallPlan:
    """One logical call and its tries: the metadata and deadlines they carry, which failure is
    tried again and until when, and what a call given up raises.

    Pure (no channel): the sync transport (``Rpc``) and the asyncio one (``sdk.aio``) drive
    it the same way; ``tries`` counts them. The first try runs outside tenacity, whose setup
    and bookkeeping (a Future and a Condition per try) cost more CPU than the rest of the
    call's Python side, and most calls succeed on it; ``first_failed`` either raises the final
    error or arms the retries, which count that try as the first of the policy's attempts.
    """

    __slots__ = (
        "_clock",
        "_replay",
        "deadline",
        "hint",
        "keyed",
        "lease_left",
        "maybe_sent",
        "metadata",
        "per_try",
        "policy",
        "retry",
        "start",
        "tries",
    )

    def __init__(
        self,
        policy: CallRetry,
        metadata: tuple[tuple[str, str], ...],
        *,
        clock: Callable[[], float],
        retry: bool,
        timeout: float | None,
        idempotency_key: str,
        lease_left: timedelta | None,
        hint: str,
        tries: Tries | None = None,
    ) -> None:
        self.policy, self._clock, self.retry = policy, clock, retry
        self.tries = tries or Tries()
        self.tries.count = 1
        self.start = clock()
        self.per_try = timeout if timeout is not None else policy.timeout.total_seconds()
        self.hint = hint or (REPEAT_HINT if lease_left is None else ATTEMPT_HINT)
        self.lease_left = lease_left.total_seconds() if lease_left is not None else None
        # One request id per logical call, the same on every retry (coordinator.request_ids).
        self.metadata = (
            *metadata,
            (request_ids.METADATA_KEY, request_ids.current() or request_ids.new()),
        )
        self.keyed = bool(idempotency_key)
        if idempotency_key:
            self.metadata += ((IDEMPOTENCY_METADATA_KEY, idempotency_key),)
        self.deadline = 0.0
        self.maybe_sent = False
        self._replay: grpc.RpcError | None = None

    def first_failed(self, exc: grpc.RpcError) -> None:
        """The first try failed with ``exc``: raise the final error, or arm the retries (the
        failure is re-raised as tenacity's first try, so it counts as one)."""
        if not (self.retry and self.policy.retries and is_retried(exc, keyed=self.keyed)):
            sent = not never_sent(exc)
            raise translate(exc, maybe_sent=sent, hint=self.hint, keyed=self.keyed) from exc
        self._replay = exc
        # Once any try may have reached a coordinator, the call's outcome is unknown for good.
        self.maybe_sent = not never_sent(exc)
        self.deadline = _budget.retry_deadline(
            self.start, self.policy.budget.total_seconds(), self.lease_left
        )

    def controls(self) -> dict[str, Any]:
        """tenacity's retry, stop and wait for the retries: transport failures only (and a keyed
        call's ABORTED), until the next try would start after the deadline or the policy's
        attempts are spent."""
        initial = self.policy.initial_backoff.total_seconds()
        attempts = self.policy.attempts
        return {
            "retry": retry_if_exception(lambda exc: is_retried(exc, keyed=self.keyed)),
            "stop": (stop_after_attempt(attempts) if attempts else stop_never)
            | _OutOfTime(self.deadline, self._clock),
            # initial, 2x, 4x ... up to max_backoff, plus up to one initial of jitter so that
            # a pool of workers cut off together does not come back in lockstep.
            "wait": wait_exponential(
                multiplier=initial, max=self.policy.max_backoff.total_seconds()
            )
            + wait_random(0, initial),
            "reraise": True,
        }

    def next_timeout(self) -> float:
        """The deadline of the next try; the first try's failure is raised again instead."""
        if self._replay is not None:
            failed, self._replay = self._replay, None
            raise failed
        self.tries.count += 1
        return _budget.try_timeout(self._clock(), self.deadline, self.per_try)

    def failed(self, exc: grpc.RpcError) -> None:
        """A retry failed with ``exc``."""
        self.maybe_sent = self.maybe_sent or not never_sent(exc)

    def given_up(self, exc: grpc.RpcError) -> CoordinatorError:
        """What the call raises when its last try failed with ``exc``."""
        return translate(exc, maybe_sent=self.maybe_sent, hint=self.hint, keyed=self.keyed)


class Caller:
    """What a transport of either kind keeps: where it connects (one channel per replica it was
    given, sdk/_target.py), as whom, with which options and policy; it plans each of its calls
    here (``CallPlan``). ``pick`` chooses the first replica among n (random: a pool's clients
    spread over them)."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        principal: str,
        retry: CallRetry,
        channel_options: Sequence[tuple[str, Any]] | None,
        clock: Callable[[], float],
        metadata: Sequence[tuple[str, str]] = (),
        pick: Callable[[int], int] = random.randrange,
    ) -> None:
        self._metadata = (*base_metadata(principal), *metadata)
        self.target = channel_target(target)
        self.targets = endpoint_targets(target)
        self.first = pick(len(self.targets))
        self._options = channel_options_of(channel_options)
        self.principal = principal
        self.policy = retry
        self._clock = clock

    def _plan(
        self,
        *,
        retry: bool,
        timeout: float | None,
        idempotency_key: str,
        lease_left: timedelta | None,
        hint: str,
        tries: Tries | None,
    ) -> CallPlan:
        return CallPlan(
            self.policy,
            self._metadata,
            clock=self._clock,
            retry=retry,
            timeout=timeout,
            idempotency_key=idempotency_key,
            lease_left=lease_left,
            hint=hint,
            tries=tries,
        )


class Rpc(Caller):
    """A channel to the coordinator's replicas with its stubs, metadata and retry policy."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        principal: str,
        retry: CallRetry,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor[Any, Any]] = (),
        clock: Callable[[], float] = time.monotonic,
        pick: Callable[[int], int] = random.randrange,
    ) -> None:
        super().__init__(
            target,
            principal=principal,
            retry=retry,
            channel_options=channel_options,
            clock=clock,
            pick=pick,
        )
        self._channels = [
            grpc.secure_channel(t, credentials, options=self._options)
            if credentials is not None
            else grpc.insecure_channel(t, options=self._options)
            for t in self.targets
        ]
        self.endpoints = Endpoints(self._channels, first=self.first)
        channel = grpc.intercept_channel(cast(grpc.Channel, self.endpoints.channel), *interceptors)
        self.worker = worker_pb2_grpc.WorkerServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        *,
        retry: bool = True,
        timeout: float | None = None,
        idempotency_key: str = "",
        lease_left: timedelta | None = None,
        hint: str = "",
        tries: Tries | None = None,
        abort: Abort | None = None,
    ) -> Resp:
        """Call ``method`` with the deadline, the principal and (if ``retry``) the retries;
        an ``idempotency_key`` goes with every try, so the server replays a landed one.
        ``abort``: ``abort.abort()`` ends the call at once (CallAborted).

        ``lease_left``: the call is made behind a claim's fence with this much lease left, and
        stops retrying when it runs out, before the budget if sooner. ``hint`` replaces what an
        OutcomeUnknown tells the caller to repeat. ``tries`` (if given) counts the tries made.

        Raises OutcomeUnknown when a failed try may have reached a coordinator, TransportError
        when none did, the mapped exception for any other status.
        """
        plan = self._plan(
            retry=retry,
            timeout=timeout,
            idempotency_key=idempotency_key,
            lease_left=lease_left,
            hint=hint,
            tries=tries,
        )
        at = self.endpoints.current
        try:
            return _send(method, request, plan.per_try, plan.metadata, abort)
        except grpc.RpcError as exc:
            plan.first_failed(exc)
            self.endpoints.failed(at)  # the retry goes to the next replica
        try:
            answer: Resp = Retrying(**plan.controls())(
                _retry_once, plan, self.endpoints, method, request, abort
            )
        except grpc.RpcError as exc:
            raise plan.given_up(exc) from exc
        return answer

    def close(self) -> None:
        """Close the channels; calls in flight fail with CANCELLED."""
        for channel in self._channels:
            channel.close()


def _send(
    method: grpc.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    timeout: float | None,
    metadata: tuple[tuple[str, str], ...],
    abort: Abort | None,
) -> Resp:
    """One try of a call; with ``abort``, as a future that ``abort.abort()`` cancels."""
    if abort is None:
        return method(request, timeout=timeout, metadata=metadata)
    if abort.aborted():
        raise CallAborted("the call was aborted before it was sent")
    call = method.future(request, timeout=timeout, metadata=metadata)
    with abort.watching(call):
        try:
            return call.result()
        except grpc.FutureCancelledError as exc:
            raise CallAborted("the call was aborted in flight") from exc


def _retry_once(
    plan: CallPlan,
    endpoints: Endpoints,
    method: grpc.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    abort: Abort | None = None,
) -> Resp:
    """One retry of a sync call (tenacity calls it); a failed one moves the client on."""
    timeout = plan.next_timeout()
    at = endpoints.current
    try:
        return _send(method, request, timeout, plan.metadata, abort)
    except grpc.RpcError as exc:
        plan.failed(exc)
        if is_transport(exc):
            endpoints.failed(at)
        raise
