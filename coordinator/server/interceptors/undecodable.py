"""Requests whose bytes are not the method's message: INVALID_ARGUMENT, before authentication,
logged quietly.

grpc's sync server decodes a request in its own callback, before any handler or interceptor
behavior runs. A deserializer that raises makes grpc log the traceback at ERROR ("Exception
deserializing message!") and answer INTERNAL, which blames the server and lets any client, even
one without a token, fill the log at will. So every registered method's deserializer is
wrapped: a DecodeError becomes an ``Undecodable`` value instead of an exception, and the
handler, first thing (ahead of the auth interceptor, registered after this one), refuses it as
INVALID_ARGUMENT with one warning line without traceback, throttled and carrying the peer.

Client-streaming methods (only reflection's) get each message checked as the behavior reads it;
the call has then passed authentication already, which reflection does not demand anyway.
Exceptions other than DecodeError are not caught: they are bugs and keep grpc's loud path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import structlog
from google.protobuf import descriptor_pool
from google.protobuf.message import DecodeError

from coordinator.logging import Throttle
from coordinator.server.interceptors.handlers import Behavior, Handler, rebuilt, streams_requests

log = structlog.get_logger(__name__)

LOG_INTERVAL = 5.0
"""Seconds between two logged refusals; the ones in between are counted in the next line."""

_MAX_DETAIL_CHARS = 200


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a request body that did not decode; never reaches a servicer."""

    error: str


def guarded(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer`` returning ``Undecodable`` where it would raise DecodeError."""

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Undecodable(str(exc)[:_MAX_DETAIL_CHARS])

    return deserialize


class UndecodableInterceptor:
    """Refuses undecodable requests as INVALID_ARGUMENT; register it ahead of authentication."""

    def __init__(self, *, throttle: Throttle | None = None) -> None:
        """``throttle`` bounds the refusal log (default: one line per ``LOG_INTERVAL``)."""
        self._throttle = throttle if throttle is not None else Throttle(LOG_INTERVAL)

    def build(self, method: str, handler: Handler) -> Handler:
        """The method's handler with a guarded deserializer and a behavior that refuses first."""
        if handler.request_deserializer is None:
            return handler

        def refuse(context: grpc.ServicerContext, request: Undecodable) -> NoReturn:
            self._refuse(method, context, request)

        return _rebuilt(handler, guarded(handler.request_deserializer), refuse)

    def _refuse(self, method: str, context: grpc.ServicerContext, request: Undecodable) -> NoReturn:
        held_back = self._throttle.admit()
        if held_back is not None:
            log.warning(
                "undecodable request refused",
                rpc=method,
                peer=context.peer(),
                error=request.error,
                suppressed=held_back,
            )
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request body could not be decoded as {_request_type(method)} ({method}): "
            f"{request.error}",
        )


Refuse = Callable[[grpc.ServicerContext, Undecodable], NoReturn]


def _rebuilt(handler: Handler, deserializer: Callable[[bytes], Any], refuse: Refuse) -> Handler:
    """``handler`` with ``deserializer``, whose behavior refuses an Undecodable request."""

    def unary_request(behavior: Behavior) -> Behavior:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                refuse(context, request)
            return behavior(request, context)

        return run

    def stream_request(behavior: Behavior) -> Behavior:
        def run(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
            return behavior(_checked(requests, context, refuse), context)

        return run

    return rebuilt(
        handler,
        lambda kind, behavior: (
            stream_request(behavior) if streams_requests(kind) else unary_request(behavior)
        ),
        request_deserializer=deserializer,
    )


def _checked(
    requests: Iterator[Any], context: grpc.ServicerContext, refuse: Refuse
) -> Iterator[Any]:
    for request in requests:
        if isinstance(request, Undecodable):
            refuse(context, request)
        yield request


def _request_type(method: str) -> str:
    """The request message's full name for ``/package.Service/Method``, as the pool knows it."""
    service, _, name = method.strip("/").partition("/")
    try:
        found = descriptor_pool.Default().FindMethodByName(f"{service}.{name}")
    except KeyError:
        return "the method's request message"
    return str(found.input_type.full_name)
