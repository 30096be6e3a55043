"""The one table from coordinator errors to gRPC status codes, and the decorator that applies it.

Servicers never call ``context.abort`` themselves: they raise a CoordinatorError (or let the
store raise one), and ``@rpc`` turns it into the mapped status with the error's own message
(the call's one log line, coordinator.server.interceptors.call_log, records it). Anything else
is a bug: it is logged here with its traceback and answered INTERNAL, without leaking the exception
text to the caller.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import structlog

from coordinator import errors

log = structlog.get_logger(__name__)

# Ordered from specific to general only for readers: lookup walks the exception's MRO, so a
# subclass (EtcdNotFound) finds its own row before its parent's (ConfigError).
STATUS_CODES: dict[type[errors.CoordinatorError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ReplicaRefused: grpc.StatusCode.UNAVAILABLE,
    # Heard by nobody, as a rule: its caller left. The status only ends the call.
    errors.Undelivered: grpc.StatusCode.CANCELLED,
    # A server misconfiguration is not the caller's fault and retrying will not help.
    errors.ConfigError: grpc.StatusCode.INTERNAL,
    errors.CoordinatorError: grpc.StatusCode.INTERNAL,
}

S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")


def status_code_of(exc: errors.CoordinatorError) -> grpc.StatusCode:
    """The status code ``exc`` maps to (its closest class in ``STATUS_CODES``)."""
    for cls in type(exc).__mro__:
        code = STATUS_CODES.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def rpc(
    method: Callable[[S, Req, grpc.ServicerContext], Resp],
) -> Callable[[S, Req, grpc.ServicerContext], Resp]:
    """Wrap a unary servicer method: CoordinatorError -> its status, anything else -> INTERNAL."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: S, request: Req, context: grpc.ServicerContext) -> Resp:
        try:
            return method(self, request, context)
        except errors.CoordinatorError as exc:
            context.abort(status_code_of(exc), str(exc))
        except Exception:
            log.exception("rpc failed unexpectedly", rpc=name)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {name}; see the server log")

    return wrapper


def stream_rpc(
    method: Callable[[S, Req, grpc.ServicerContext], Iterator[Resp]],
) -> Callable[[S, Req, grpc.ServicerContext], Iterator[Resp]]:
    """``@rpc`` for server-streaming methods: errors raised while streaming map to statuses
    through the same table."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: S, request: Req, context: grpc.ServicerContext) -> Iterator[Resp]:
        try:
            yield from method(self, request, context)
        except errors.CoordinatorError as exc:
            context.abort(status_code_of(exc), str(exc))
        except Exception:
            if not context.is_active():  # the caller went away mid-stream
                return
            log.exception("rpc failed unexpectedly", rpc=name)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {name}; see the server log")

    return wrapper
