"""The one server interceptor: every stage's handler built once per method, not once per call.

gRPC's Python server runs its interceptor chain for every call: each interceptor is asked for a
handler, and each builds a new one around the next (a handler tuple and closures per stage per
call; with eleven stages that was 4-9% of the server's Python samples on the hot path). The
stages here (auth, call log, bounds, budgets, idempotency, ...) decide per call inside the
behavior they wrap, from the call's context and metadata, so what wraps a method never changes
once built: the pipeline builds it on the method's first call and serves the same handler to
every later one.

A stage is any object with ``build(method, handler) -> handler``: given a method's path and the
handler of the stages inside it (the servicer's, innermost), the handler to serve instead (the
same one, to pass). ``build`` runs once per method and handler, so it must read nothing of a
call: no metadata, no state that changes (read those in the behavior).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from coordinator.server.interceptors.handlers import Handler


class Stage(Protocol):
    """One step of the pipeline (the module docstring)."""

    def build(self, method: str, handler: Handler) -> Handler:
        """The handler to serve for ``method`` around ``handler``."""


class Pipeline(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """``stages``, outermost first, as one interceptor whose handlers are built once."""

    def __init__(self, stages: Sequence[Stage]) -> None:
        self._stages = tuple(reversed(stages))  # built innermost first
        # method -> (the servicer's handler it was built on, the handler served); only methods
        # with a handler get an entry, so the map is as large as the services, whatever is called
        self._built: dict[str, tuple[Handler, Handler]] = {}

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Handler | None],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        """The method's built handler; unknown methods (no handler) pass through as None."""
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        built = self._built.get(method)
        if built is not None and built[0] is handler:
            return built[1]
        served = handler
        for stage in self._stages:
            served = stage.build(method, served)
        # Two first calls may both build: the same handlers, and either one is kept.
        self._built[method] = (handler, served)
        return served
