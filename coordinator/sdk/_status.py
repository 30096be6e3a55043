"""What a failed SDK call means: which gRPC statuses are tried again, and which exception a
status becomes (pure: no channel). The sync transport (sdk/_rpc.py) and the asyncio one
(sdk/aio/_rpc.py) decide the same way from here.
"""

from __future__ import annotations

import grpc

from coordinator.errors import (
    AlreadyExists,
    CoordinatorError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
)
from coordinator.sdk.types import NotSupported, OutcomeUnknown, TransportError

TRANSPORT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
"""The only status codes the SDK retries: the call may not have reached the coordinator, or a
replica at its concurrency bound refused it before running it (RESOURCE_EXHAUSTED: a burst past
the bound is retried, never taken for a lost claim)."""

# A keyed call's duplicate answered while its first try still runs
# (server/interceptors/idempotency.py): the server says "retry shortly", and the retry is
# answered with the first try's stored answer.
_IN_FLIGHT = grpc.StatusCode.ABORTED

# How gRPC's load balancers fail a call they could not give any connection (pick_first,
# round_robin): no stream was opened, so the request never left. Any other transport failure
# (a connection reset mid-call, a deadline) may have reached a coordinator.
_NEVER_SENT = ("failed to connect to all addresses", "connections to all backends failing")

ATTEMPT_HINT = "retry the same call on the same attempt to learn it"
"""What OutcomeUnknown tells the caller of a call behind a claim's fence."""
REPEAT_HINT = "repeat the same call to learn it (a create: with the same task id or key)"
"""What OutcomeUnknown tells the caller of any other call."""
RENEW_HINT = "the next renewal learns it"
"""What OutcomeUnknown tells of a renewal (the keepalive renews again by itself)."""
READ_HINT = "a read, nothing changed: repeat it"
"""What a read that failed says instead of an unknown outcome: a read has none."""
_READS = ("Get", "List", "DrainStatus")


def hint_for(request_name: str, *, behind_fence: bool) -> str:
    """What an unknown outcome of a ``request_name`` call (a message name) tells its caller."""
    if request_name in ("RenewRequest", "RenewManyRequest"):
        return RENEW_HINT
    if request_name.startswith(_READS):
        return READ_HINT
    return ATTEMPT_HINT if behind_fence else REPEAT_HINT


_ERRORS: dict[grpc.StatusCode, type[CoordinatorError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNIMPLEMENTED: NotSupported,
}


def is_transport(exc: BaseException) -> bool:
    """Whether ``exc`` is a gRPC failure that may not have reached the coordinator."""
    return isinstance(exc, grpc.RpcError) and exc.code() in TRANSPORT_CODES


def is_retried(exc: BaseException, *, keyed: bool) -> bool:
    """Whether a try that failed with ``exc`` is tried again: a transport failure, or for a
    call with an idempotency key (``keyed``) its duplicate refused while the first runs."""
    in_flight = keyed and isinstance(exc, grpc.RpcError) and exc.code() is _IN_FLIGHT
    return is_transport(exc) or in_flight


def never_sent(exc: grpc.RpcError) -> bool:
    """Whether ``exc`` failed before any connection took the request, or a replica refused to
    run it (RESOURCE_EXHAUSTED is answered before the handler runs): it cannot have landed."""
    details = exc.details() or ""
    if exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return True
    return exc.code() is grpc.StatusCode.UNAVAILABLE and details.startswith(_NEVER_SENT)


NO_COORDINATOR_HINT = " (is one serving at the target? `coordinator up` runs one on this machine)"
"""What a call none of whose tries reached a coordinator says to check."""


def error_of(code: str, message: str) -> CoordinatorError:
    """The coordinator exception for an error a batch answered for one of its items (a gRPC
    status code's name and its message), as ``translate`` maps a call's status."""
    status: grpc.StatusCode | None = getattr(grpc.StatusCode, code, None)
    kind = _ERRORS.get(status, CoordinatorError) if status is not None else CoordinatorError
    return kind(f"{code}: {message}")


def translate(
    exc: grpc.RpcError,
    *,
    maybe_sent: bool | None = None,
    hint: str = REPEAT_HINT,
    keyed: bool = False,
) -> CoordinatorError:
    """The coordinator exception for a gRPC error. A transport code (and a ``keyed`` call's
    ABORTED: its first try still ran) becomes OutcomeUnknown (with ``hint``, what to repeat)
    if a try of the call ``maybe_sent`` its request to a coordinator, a TransportError saying
    so if none did, a bare TransportError if the caller does not know (a broken stream)."""
    code = exc.code()
    name = code.name if code is not None else "UNKNOWN"
    message = f"{name}: {exc.details()}"
    if code not in TRANSPORT_CODES and not (keyed and code is _IN_FLIGHT):
        return _ERRORS.get(code, CoordinatorError)(message)
    if maybe_sent is None:
        return TransportError(message, code=name)
    if maybe_sent and hint == READ_HINT:
        return TransportError(f"{message}; {hint}", code=name)
    if maybe_sent:
        return OutcomeUnknown(f"{message}; outcome unknown, not failed; {hint}", code=name)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:  # a coordinator answered: a bound refused it
        return TransportError(f"{message}; refused on every try, nothing ran", code=name)
    return TransportError(
        f"{message}; no try reached a coordinator{NO_COORDINATOR_HINT}", code=name
    )
