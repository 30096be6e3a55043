"""The SDK's transport: one channel, the three service stubs, deadlines, retries, error mapping.

Every call carries the caller's principal in metadata and a deadline. Transport failures
(UNAVAILABLE, DEADLINE_EXCEEDED) are retried with exponential backoff and a bounded number of
attempts; every other status is final and becomes one of the coordinator's exceptions.

Why retrying is safe: every worker call is idempotent per attempt. A renew only keeps the same
lease alive; a repeated commit of the same attempt and digest answers COMMITTED again (the
contract says so); a repeated stage overwrites the attempt's own staging key with the same
bytes; authorize writes nothing; a repeated release answers FENCED/RELEASED without a second
transition. A claim whose response was lost cannot be answered twice, but it grants nothing
twice either: the orphaned claim's lease simply expires after its TTL and the task is
reclaimed. Task creation is retried only with an explicit task id (see WorkerClient).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from coordinator import __version__, request_ids
from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.errors import (
    AlreadyExists,
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from coordinator.sdk.types import TransportError
from coordinator.v1 import admin_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc

PRINCIPAL_METADATA = "x-coordinator-principal"
"""The gRPC metadata key that names the calling principal."""

SDK_VERSION_METADATA = "x-coordinator-sdk-version"
"""The gRPC metadata key that names this SDK's version (the server's version gate reads it)."""

TRANSPORT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
"""The only status codes the SDK retries: the call may not have reached the coordinator."""

_ERRORS: dict[grpc.StatusCode, type[CoordinatorError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}

# A restarted coordinator is found again within a second, not after gRPC's default backoff
# (which grows to two minutes); callers may override any of these.
_DEFAULT_CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True)
class RetryPolicy:
    """Deadlines and transport retries of every SDK call."""

    # Deadline of one try of one call.
    timeout: timedelta = timedelta(seconds=10)
    # Tries per call, the first included (1: no retries).
    attempts: int = 5
    initial_backoff: timedelta = timedelta(milliseconds=100)
    max_backoff: timedelta = timedelta(seconds=2)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise InvalidArgument(f"RetryPolicy.attempts must be >= 1, got {self.attempts}")
        if self.timeout <= timedelta(0):
            raise InvalidArgument(f"RetryPolicy.timeout must be positive, got {self.timeout}")


def is_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is a gRPC failure that may not have reached the coordinator."""
    return isinstance(exc, grpc.RpcError) and exc.code() in TRANSPORT_CODES


def translate(exc: grpc.RpcError) -> CoordinatorError:
    """The coordinator exception for a gRPC error (transport codes become TransportError)."""
    code = exc.code()
    name = code.name if code is not None else "UNKNOWN"
    message = f"{name}: {exc.details()}"
    if code in TRANSPORT_CODES:
        return TransportError(message, code=name)
    return _ERRORS.get(code, CoordinatorError)(message)


class Rpc:
    """A channel to one coordinator target with its stubs, metadata and retry policy."""

    def __init__(
        self,
        target: str,
        *,
        principal: str,
        retry: RetryPolicy,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor[Any, Any]] = (),
    ) -> None:
        if not principal:
            raise InvalidArgument("principal must not be empty")
        options = {**_DEFAULT_CHANNEL_OPTIONS, **dict(channel_options or ())}
        if credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=list(options.items()))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options.items()))
        channel = grpc.intercept_channel(self._channel, *interceptors)
        self.target = target
        self.principal = principal
        self.policy = retry
        self.worker = worker_pb2_grpc.WorkerServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)
        self._metadata = ((PRINCIPAL_METADATA, principal), (SDK_VERSION_METADATA, __version__))

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        *,
        retry: bool = True,
        timeout: float | None = None,
        idempotency_key: str = "",
    ) -> Resp:
        """Call ``method`` with the deadline, the principal and (if ``retry``) the retries;
        an ``idempotency_key`` goes with every try, so the server replays a landed one.

        Raises TransportError after the last failed try, the mapped exception otherwise.
        """
        deadline = timeout if timeout is not None else self.policy.timeout.total_seconds()
        # One request id per logical call, the same on every retry (coordinator.request_ids).
        metadata: tuple[tuple[str, str], ...] = (
            *self._metadata,
            (request_ids.METADATA_KEY, request_ids.current() or request_ids.new()),
        )
        if idempotency_key:
            metadata += ((IDEMPOTENCY_METADATA_KEY, idempotency_key),)
        # The first try runs outside tenacity, whose setup and bookkeeping (a Future and a
        # Condition per try) cost more CPU than the rest of the call's Python side, and most
        # calls succeed on it. A transport failure that may be retried goes on to _retry,
        # which counts this try as the first of the policy's attempts.
        try:
            return method(request, timeout=deadline, metadata=metadata)
        except grpc.RpcError as exc:
            if not (retry and self.policy.attempts > 1 and is_transport(exc)):
                raise translate(exc) from exc
            first = exc
        return self._retry(method, request, first, timeout=deadline, metadata=metadata)

    def _retry(
        self,
        method: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        first: grpc.RpcError,
        *,
        timeout: float,
        metadata: tuple[tuple[str, str], ...],
    ) -> Resp:
        """The tries after a ``first`` transport failure, with backoff, up to the policy's
        attempts (``first`` counts as the first: it is re-raised as tenacity's first try)."""
        initial = self.policy.initial_backoff.total_seconds()
        retrying = Retrying(
            retry=retry_if_exception(is_transport),
            stop=stop_after_attempt(self.policy.attempts),
            # initial, 2x, 4x ... up to max_backoff, plus up to one initial of jitter so that
            # a pool of workers cut off together does not come back in lockstep.
            wait=wait_exponential(multiplier=initial, max=self.policy.max_backoff.total_seconds())
            + wait_random(0, initial),
            reraise=True,
        )
        replay: grpc.RpcError | None = first
        try:
            for attempt in retrying:
                with attempt:
                    if replay is not None:
                        failed, replay = replay, None
                        raise failed
                    return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise translate(exc) from exc
        raise AssertionError("unreachable: tenacity either returns or re-raises")

    def close(self) -> None:
        """Close the channel; calls in flight fail with CANCELLED."""
        self._channel.close()
