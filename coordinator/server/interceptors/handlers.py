"""What the server interceptors share: the handler type, a handler rebuilt around a new
behavior (whichever of gRPC's four kinds it is), and reading one metadata value of a call."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:  # generic in the stubs only
    Handler = grpc.RpcMethodHandler[Any, Any]
else:
    Handler = grpc.RpcMethodHandler

Behavior = Callable[[Any, grpc.ServicerContext], Any]


def unary_handler(
    handler: Handler, behavior: Behavior, *, response_serializer: Any = None
) -> Handler:
    """A unary-unary handler running ``behavior`` with ``handler``'s (de)serializers (or the
    given response serializer)."""
    return grpc.unary_unary_rpc_method_handler(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=response_serializer or handler.response_serializer,
    )


# gRPC's four kinds of method, as (the handler's attribute, its factory); "stream_" first means
# the requests stream, "_stream" last the responses.
_KINDS: tuple[tuple[str, Callable[..., Handler]], ...] = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)

Wrap = Callable[[str, Behavior], Behavior]
"""Given a method's kind ("unary_stream", ...) and its behavior, the behavior to run instead."""


def rebuilt(handler: Handler, wrap: Wrap, *, request_deserializer: Any = None) -> Handler:
    """``handler`` of the same kind and serializers (or ``request_deserializer``), running
    ``wrap(kind, behavior)`` instead of its behavior."""
    for kind, factory in _KINDS:
        behavior = getattr(handler, kind)
        if behavior is not None:
            return factory(
                wrap(kind, behavior),
                request_deserializer=request_deserializer or handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    return handler


def streams_responses(kind: str) -> bool:
    """Whether a method of ``kind`` answers with a stream."""
    return kind.endswith("_stream")


def streams_requests(kind: str) -> bool:
    """Whether a method of ``kind`` takes a stream of requests."""
    return kind.startswith("stream_")


def metadata_value(metadata: Any, name: str) -> str | None:
    """The first value of metadata key ``name`` as text, or None when the call has none."""
    for key, value in metadata or ():
        if key == name:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None
