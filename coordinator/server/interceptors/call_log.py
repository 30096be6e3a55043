"""One log line per call, written by one interceptor when the call ends.

The line says which method, its status code, who called (the authenticated principal), how long
it took, the request id, and whatever the handler bound for the call (``coordinator.logging``:
task, attempt, generation, epoch, the verdict's outcome and reason, ...). A call answered OK is
``rpc``; any other status is ``rpc refused`` with the status message as ``error``, at warning
level when the fault is ours (the store unreachable, a bug) and info when it is the caller's.
A call refused RESOURCE_EXHAUSTED (a bound: a share, a budget, a full replica) is logged at most
once per principal per interval (coordinator.server.refusal_log), with how many were left out:
a pool whose polls are refused and retried would otherwise write a line per retry.
Handlers therefore log no line of their own per call; a bug's traceback is still logged where it
is caught (coordinator.server.status).

Registered right after authentication (coordinator.server.app), so the principal is known and
every later refusal (stream bounds, version gate, idempotency) is on the line too; refusals by
authentication itself are logged there, with the peer's address. Only the coordinator's own
services are logged: health probes and reflection would drown the log.

gRPC runs the handler (and, for a response stream, every ``next``) on a pool thread; each call
runs in its own copy of the context, so what one handler binds never reaches another call.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Collection, Iterator
from typing import Any

import grpc
import structlog

from coordinator.logging import CALL_FIELDS
from coordinator.server.identity import CURRENT_IDENTITY
from coordinator.server.interceptors.handlers import (
    Behavior,
    Handler,
    rebuilt,
    streams_responses,
)
from coordinator.server.interceptors.request_ids import request_id_of
from coordinator.server.refusal_log import RefusalLog

log = structlog.get_logger(__name__)

_OUR_FAULT = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
)


class CallLogInterceptor:
    """Logs each call of ``services`` (fully qualified names) once, when it ends."""

    def __init__(self, services: Collection[str], *, refusals: RefusalLog | None = None) -> None:
        self._services = frozenset(services)
        self._refusals = refusals if refusals is not None else RefusalLog()

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap the handler of a method of the logged services; others pass through."""
        if _service(method) not in self._services:
            return handler
        refusals = self._refusals
        return rebuilt(
            handler,
            lambda kind, behavior: (
                _streamed(method, behavior, refusals)
                if streams_responses(kind)
                else _answered(method, behavior, refusals)
            ),
        )


def _service(method: str) -> str:
    """``pkg.Service`` of ``/pkg.Service/Method``."""
    return method.split("/")[1] if method.count("/") == 2 else ""


class _Call:
    """One call being logged: its own context, its fields, when it started."""

    def __init__(self, method: str, context: grpc.ServicerContext, refusals: RefusalLog) -> None:
        self.started = time.perf_counter()
        self._refusals = refusals
        identity = CURRENT_IDENTITY.get()
        self.fields: dict[str, Any] = {"method": method}
        request_id = request_id_of(context)
        if request_id is not None:
            self.fields["request_id"] = request_id
        self.fields["principal"] = identity.principal if identity is not None else ""
        self.context = contextvars.copy_context()
        self.context.run(CALL_FIELDS.set, self.fields)

    def end(self, context: grpc.ServicerContext, *, failed: bool, cancelled: bool = False) -> None:
        """Write the call's line from the status ``context`` ended with."""
        # grpc sets the code (and details) on abort; the typing stubs lack code()/details().
        code = context.code()  # type: ignore[attr-defined]
        if code is None:
            code = grpc.StatusCode.CANCELLED if cancelled else _default_code(failed)
        line = {
            **self.fields,
            "code": code.name,
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
        }
        if code is grpc.StatusCode.OK:
            log.info("rpc", **line)
            return
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            left_out = self._refusals.due(self.fields["principal"])
            if left_out is None:
                return  # counted in metrics; this principal's line was written recently
            line["refusals_not_logged"] = left_out
        details = context.details()  # type: ignore[attr-defined]
        if isinstance(details, bytes):
            details = details.decode(errors="replace")
        level = log.warning if code in _OUR_FAULT else log.info
        level("rpc refused", **line, error=details or "")


def _default_code(failed: bool) -> grpc.StatusCode:
    # What grpc answers for an exception that set no code.
    return grpc.StatusCode.UNKNOWN if failed else grpc.StatusCode.OK


def _answered(method: str, behavior: Behavior, refusals: RefusalLog) -> Behavior:
    def run(request: Any, context: grpc.ServicerContext) -> Any:
        call = _Call(method, context, refusals)
        try:
            response = call.context.run(behavior, request, context)
        except BaseException:
            call.end(context, failed=True)
            raise
        call.end(context, failed=False)
        return response

    return run


def _streamed(method: str, behavior: Behavior, refusals: RefusalLog) -> Behavior:
    def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        call = _Call(method, context, refusals)
        try:
            responses = call.context.run(behavior, request, context)
            while True:
                try:
                    response = call.context.run(next, responses)
                except StopIteration:
                    break
                yield response
        except GeneratorExit:  # the caller went away
            call.end(context, failed=True, cancelled=True)
            raise
        except BaseException:
            call.end(context, failed=True)
            raise
        call.end(context, failed=False)

    return run
