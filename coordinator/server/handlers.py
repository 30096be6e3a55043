"""What the server interceptors share: the handler type, a unary handler rebuilt around a new
behavior, and reading one metadata value of a call."""

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


def metadata_value(metadata: Any, name: str) -> str | None:
    """The first value of metadata key ``name`` as text, or None when the call has none."""
    for key, value in metadata or ():
        if key == name:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None
