"""Binds each call's ``x-request-id`` for its handler, so the event it writes carries it.

gRPC looks a handler up on its polling thread and runs it on a pool thread, so the id is read
and bound inside the wrapped behavior (the pool thread), not when the handler is built. A
missing or malformed id binds nothing (the event then carries none): the id is evidence for
audits and the chaos checker, never a reason to refuse a call.
"""

from __future__ import annotations

from typing import Any

import grpc

from coordinator import request_ids
from coordinator.server.interceptors.handlers import Handler, metadata_value, unary_handler


class RequestIdInterceptor:
    """Runs unary-unary handlers with the call's request id bound (coordinator.request_ids)."""

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap unary-unary handlers: a call that carries a valid id runs with it bound."""
        del method
        if handler.unary_unary is None:
            return handler
        run = handler.unary_unary

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            request_id = request_id_of(context)
            if request_id is None:
                return run(request, context)
            with request_ids.bound(request_id):
                return run(request, context)

        return unary_handler(handler, behavior)


def request_id_of(context: grpc.ServicerContext) -> str | None:
    """The call's ``x-request-id`` if it sent a valid one."""
    request_id = metadata_value(context.invocation_metadata(), request_ids.METADATA_KEY)
    return request_id if request_id is not None and request_ids.is_valid(request_id) else None
