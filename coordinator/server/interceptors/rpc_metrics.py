"""RPC latency and error counts per method, as one server interceptor.

Registered outermost (coordinator.server.app), so every call to a real method is counted:
authentication and permission refusals (UNAUTHENTICATED, PERMISSION_DENIED) and version-gate
refusals (FAILED_PRECONDITION) included, as well as idempotent replays. gRPC finds no handler
for an unknown method, and this interceptor then has nothing to wrap, so the ``method`` label
only ever holds the services' real method paths (a bounded label set whatever callers send).

A call's status is read off its context once the handler is done: ``context.abort`` (the
``@rpc`` error table) sets the code before it raises, an uncaught exception is ``UNKNOWN``.
Business outcomes (FENCED, ALREADY_CLAIMED, ...) are OK responses, never errors: they are
counted by the store's own metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from coordinator.metrics import Metrics
from coordinator.server.interceptors.handlers import Handler, unary_handler


class RpcMetricsInterceptor:
    """Times unary calls and counts non-OK statuses of every call, on ``metrics``."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap unary-unary and unary-stream handlers; others pass through."""
        if handler.unary_unary is not None:
            return unary_handler(handler, _timed(self._metrics, method, handler.unary_unary))
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _streamed(self._metrics, method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


def _timed(
    metrics: Metrics, method: str, run: Callable[[Any, grpc.ServicerContext], Any]
) -> Callable[[Any, grpc.ServicerContext], Any]:
    def behavior(request: Any, context: grpc.ServicerContext) -> Any:
        start = time.perf_counter()
        try:
            response = run(request, context)
        except BaseException:
            _count_error(metrics, method, context, failed=True)
            raise
        finally:
            metrics.rpc_duration.labels(method=method).observe(time.perf_counter() - start)
        _count_error(metrics, method, context, failed=False)
        return response

    return behavior


def _streamed(
    metrics: Metrics, method: str, run: Callable[[Any, grpc.ServicerContext], Iterator[Any]]
) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
    # A stream's lifetime is not a latency (WatchEvents follows for as long as the caller
    # likes), so streams count errors only.
    def behavior(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from run(request, context)
        except GeneratorExit:  # the caller went away: not an error of ours
            raise
        except BaseException:
            _count_error(metrics, method, context, failed=True)
            raise
        _count_error(metrics, method, context, failed=False)

    return behavior


def _count_error(
    metrics: Metrics, method: str, context: grpc.ServicerContext, *, failed: bool
) -> None:
    # grpc sets the code on abort; the typing stubs lack ServicerContext.code().
    code = context.code()  # type: ignore[attr-defined]
    if code is None or code == grpc.StatusCode.OK:
        if not failed:
            return
        code = grpc.StatusCode.UNKNOWN  # what grpc answers for an uncaught exception
    metrics.rpc_errors.labels(method=method, code=code.name).inc()
