"""One call's plan, shared by the sync and the asyncio transport: the policy (``CallRetry``),
the metadata every try carries, which failure is tried again and until when (``CallPlan``), and
what a call given up raises (sdk/_status.py). Pure: no channel is opened here; ``Caller`` only
keeps where a transport connects and plans its calls (sdk/_rpc.py and sdk/aio/_rpc.py send).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from tenacity import (
    RetryCallState,
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
    hint_for,
    is_retried,
    is_transport,
    never_sent,
    translate,
)
from coordinator.sdk._target import LB_OPTION, Endpoints, channel_target, endpoint_targets

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

    ``budget`` bounds how long one call keeps retrying, from its first try's failure; a call
    behind a claim's fence stops sooner if the lease ends sooner. The default, 15 s, outlasts what a
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
        request_name: str = "",
        tries: Tries | None = None,
    ) -> None:
        self.policy, self._clock, self.retry = policy, clock, retry
        self.tries = tries or Tries()
        self.tries.count = 1
        self.start = clock()
        self.per_try = timeout if timeout is not None else policy.timeout.total_seconds()
        self.hint = hint or hint_for(request_name, behind_fence=lease_left is not None)
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

    def first_failed(self, exc: grpc.RpcError, endpoints: Endpoints, at: int) -> None:
        """The first try, sent to replica ``at``, failed with ``exc``: raise the final error,
        or arm the retries (the failure is re-raised as tenacity's first try, so it counts as
        one)."""
        _leave(exc, endpoints, at)
        if not (self.retry and self.policy.retries and is_retried(exc, keyed=self.keyed)):
            sent = not never_sent(exc)
            raise translate(exc, maybe_sent=sent, hint=self.hint, keyed=self.keyed) from exc
        self._replay = exc
        # Once any try may have reached a coordinator, the call's outcome is unknown for good.
        self.maybe_sent = not never_sent(exc)
        self.deadline = _budget.retry_deadline(
            self.start, self._clock(), self.policy.budget.total_seconds(), self.lease_left
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

    def failed(self, exc: grpc.RpcError, endpoints: Endpoints, at: int) -> None:
        """A retry, sent to replica ``at``, failed with ``exc``."""
        _leave(exc, endpoints, at)
        self.maybe_sent = self.maybe_sent or not never_sent(exc)

    def given_up(self, exc: grpc.RpcError) -> CoordinatorError:
        """What the call raises when its last try failed with ``exc``."""
        return translate(exc, maybe_sent=self.maybe_sent, hint=self.hint, keyed=self.keyed)


def _leave(exc: grpc.RpcError, endpoints: Endpoints, at: int) -> None:
    """A replica that cannot be reached is left before anything else: also by a call that is
    not retried (a keepalive's renewal), so the next one goes elsewhere instead of to the same
    dead replica until its claims run out."""
    if is_transport(exc):
        endpoints.failed(at)


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
        request: Any,
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
            request_name=type(request).__name__,
            tries=tries,
        )
