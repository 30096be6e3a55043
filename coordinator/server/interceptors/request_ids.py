"""Binds each call's ``x-request-id`` for its handler, so the event it writes carries it.

gRPC looks a handler up on its polling thread and runs it on a pool thread, so the id is bound
inside the wrapped behavior (the pool thread), not in ``intercept_service``. A missing or
malformed id binds "" (the event then carries none): the id is evidence for audits and the
chaos checker, never a reason to refuse a call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from coordinator import request_ids
from coordinator.server.interceptors.handlers import Handler, metadata_value, unary_handler


class RequestIdInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Runs unary-unary handlers with the call's request id bound (coordinator.request_ids)."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        """Wrap unary-unary handlers of calls that carry a valid id; others pass through."""
        handler = continuation(details)
        if handler is None or handler.unary_unary is None:
            return handler
        request_id = metadata_value(details.invocation_metadata, request_ids.METADATA_KEY) or ""
        if not request_ids.is_valid(request_id):
            return handler
        run = handler.unary_unary

        def behavior(request: Any, context: grpc.ServicerContext) -> Any:
            with request_ids.bound(request_id):
                return run(request, context)

        return unary_handler(handler, behavior)
