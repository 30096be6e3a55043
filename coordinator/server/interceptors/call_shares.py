"""A bounded share of the replica's unary threads per principal.

The sync gRPC server runs each call on one of ``max_workers`` handler threads (long-lived calls
have threads of their own: coordinator.server.streams). One principal sending calls back to
back from 50 threads held every one of them: other principals' Renews waited in gRPC's queue,
were refused at its concurrency bound, and 500 legitimate claims expired (issue 25). So a
principal may run at most ``max_calls_per_principal`` unary calls at once on a replica; one
past it is refused RESOURCE_EXHAUSTED before its handler runs (nothing read, nothing written;
the SDK retries it with backoff, on another replica when it has one), counted in
``coordinator_calls_refused_total{reason="principal_share"}``. The rest of the threads stay for
the other principals, whatever one of them sends.

Health and reflection (no credentials) and long polls (counted by the stream bounds) pass by.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from coordinator.errors import ResourceExhausted
from coordinator.metrics import Metrics
from coordinator.server.identity import CURRENT_IDENTITY
from coordinator.server.interceptors.handlers import Handler, rebuilt
from coordinator.server.streams import LONG_POLLS, LongPolls

REFUSED = "principal_share"
"""The ``reason`` label of a call refused past its principal's share."""


class CallShares:
    """Unary calls running per principal, each principal within ``per_principal``."""

    def __init__(self, per_principal: int, metrics: Metrics) -> None:
        self._per_principal = per_principal
        self._metrics = metrics
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    def enter(self, principal: str) -> None:
        """Count one more call of ``principal``, or raise ResourceExhausted naming the bound."""
        with self._lock:
            admitted = self._running[principal] < self._per_principal
            if admitted:
                self._running[principal] += 1
        if not admitted:
            self._metrics.count_call_refused(REFUSED)
            raise ResourceExhausted(
                f"principal {principal!r} already runs {self._per_principal} calls on this "
                "replica, the most one principal may (max_calls_per_principal); retry with "
                "backoff, send fewer calls at once, or raise max_calls_per_principal"
            )

    def leave(self, principal: str) -> None:
        """One call of ``principal`` ended."""
        with self._lock:
            self._running[principal] -= 1
            if not self._running[principal]:
                del self._running[principal]


class CallShareInterceptor:
    """Runs each authenticated unary call within its principal's share (``CallShares``).
    Registered after authentication (the principal is known) and before anything reads etcd."""

    def __init__(self, shares: CallShares, *, long_polls: LongPolls = LONG_POLLS) -> None:
        self._shares = shares
        self._long_polls = long_polls

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap a unary-unary handler; streams pass through (the stream bounds hold them)."""
        if handler.unary_unary is None:
            return handler
        waits = self._long_polls.get(method)
        shares = self._shares

        def shared(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                identity = CURRENT_IDENTITY.get()
                if identity is None or (waits is not None and waits(request)):
                    return behavior(request, context)
                try:
                    shares.enter(identity.principal)
                except ResourceExhausted as exc:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
                try:
                    return behavior(request, context)
                finally:
                    shares.leave(identity.principal)

            return run

        return rebuilt(handler, lambda kind, behavior: shared(behavior))
