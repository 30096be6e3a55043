"""Long-lived calls (server streams, and later long polls) and the bounds that keep them from
taking the threads unary calls need.

Every call of the sync gRPC server holds a handler thread for as long as it runs. A unary call
holds one for milliseconds; a followed ``WatchEvents`` stream for as long as its caller likes.
Without a bound, 32 open streams took all 32 threads and every other call - health and Renew
included - waited past its deadline. So long-lived calls are counted apart (``OpenStreams``):

* at most ``max_streams`` are open on the replica; a principal is always let open
  ``max_per_principal`` (its guaranteed share) while there is room, and past it borrows idle
  slots but never the replica's last quarter (``domain.stream_limits.admission``: fairness,
  not threads, is what the per-principal bound protects); a call past either bound is refused
  RESOURCE_EXHAUSTED, naming the setting;
* each ends after ``max_age`` seconds with UNAVAILABLE (what gRPC clients and ``coordinator events
  --follow`` retry), and its caller resumes from the last event it received. This bounds how
  long one thread is held and makes every caller come back through authentication;
* its credentials are checked again every ``sweep_interval`` (at most the token file's reload
  interval), so a revoked or expired token ends it UNAUTHENTICATED.

The server's thread pool is then ``max_workers + max_streams`` threads with grpc's own
``maximum_concurrent_rpcs`` at the same total (coordinator.server.app): since streams never hold
more than ``max_streams`` of them, ``max_workers`` are always left for unary calls, and a call
past the total is refused RESOURCE_EXHAUSTED by grpc instead of queueing unseen.

A handler ends its stream by seeing ``StreamGuard.alive()`` turn false (WatchEvents passes it to
``events.follow``); a follower that fell behind ends itself with the position to resume after
(``StreamGuard.fell_behind`` only counts it). A handler that does not look - blocked sending to
a caller that stopped reading, or a stream that never asks (reflection, health Watch) - is cut
by the sweep ``stuck_grace`` seconds after its end was decided, with the status it would have
ended with (``cut``), not a bare CANCELLED.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from coordinator.domain.stream_limits import (
    UNAUTHENTICATED_CALLERS,
    Admission,
    StreamLimits,
    admission,
    refusal_message,
)
from coordinator.errors import PermissionDenied, ResourceExhausted, Unauthenticated
from coordinator.metrics import METRICS, Metrics

if TYPE_CHECKING:  # an annotation only: the bounds sit below the interceptors that apply them
    from coordinator.server.interceptors.handlers import Handler

log = structlog.get_logger(__name__)

LongPolls = Mapping[str, Callable[[Any], bool]]
"""Unary method -> whether one of its requests waits long (is admitted as a long-lived call)."""

LONG_POLLS: LongPolls = MappingProxyType(
    {
        # ClaimNext waits only when asked to: one without wait_seconds answers at once and is
        # not counted against the stream bounds.
        "/coordinator.v1.WorkerService/ClaimNext": lambda request: request.wait_seconds > 0,
    }
)
"""Unary methods that may wait long for an answer (long polls), and which requests do.

Streaming methods need no entry: every one is long-lived (``is_long_lived``), so a new stream
is bounded from its first line of code. A unary long poll is decided per request, once it is
decoded (coordinator.server.interceptors.stream_interceptor)."""


def is_long_lived(method: str, handler: Handler, *, long_polls: LongPolls = LONG_POLLS) -> bool:
    """Whether a call of ``method`` may hold its thread for long: any stream, or a long poll
    (some of whose requests may)."""
    return bool(handler.request_streaming or handler.response_streaming) or method in long_polls


class EndReason(Enum):
    """Why the server ends a long-lived call before its handler finished."""

    MAX_AGE = "max_age"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"
    BEHIND = "behind"  # a follower's buffer stayed full: it read too slowly, or not at all


@dataclass(frozen=True)
class StreamEnding:
    """The status a long-lived call is ended with, and why."""

    reason: EndReason
    code: grpc.StatusCode
    message: str


Recheck = Callable[[bool], None]
"""Authenticates a call's credentials again (``True``: taking in a changed token file first,
not at its next periodic reload); raises Unauthenticated or PermissionDenied."""


class StreamGuard:
    """One open long-lived call: its owner, its deadline, and whether it must end."""

    def __init__(
        self,
        *,
        principal: str,
        context: grpc.ServicerContext,
        recheck: Recheck | None,
        limits: StreamLimits,
        monotonic: Callable[[], float],
        metrics: Metrics,
    ) -> None:
        self.principal = principal
        self._metrics = metrics
        self._context = context
        self._recheck = recheck
        self._max_age = limits.max_age
        self._stuck_grace = limits.stuck_grace
        self._monotonic = monotonic
        self._deadline = monotonic() + limits.max_age
        self._lock = threading.Lock()
        self._ending: StreamEnding | None = None
        self._ended_at = 0.0
        self._behind: Callable[[], str] | None = None
        self._behind_at = 0.0
        self._cancelled = False

    def alive(self) -> bool:
        """Whether the handler should go on: the caller is there, the call is younger than its
        maximum age, and its credentials held at the last check."""
        if self._monotonic() >= self._deadline:
            self._end_at_max_age()
        return self.ending is None and self._context.is_active()

    @property
    def ending(self) -> StreamEnding | None:
        """The status to end the call with, once the server decided to end it."""
        with self._lock:
            return self._ending

    def check(self) -> None:
        """The sweep's look at this call: its age, its credentials, and whether it is stuck."""
        now = self._monotonic()
        if now >= self._deadline:
            self._end_at_max_age()
        elif self._recheck is not None:
            try:
                self._recheck(False)
            except Unauthenticated as exc:
                self._end(EndReason.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED, str(exc))
            except PermissionDenied as exc:
                self._end(EndReason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED, str(exc))
        self._cancel_if_stuck(now)

    def confirm(self) -> None:
        """Check the caller's credentials now (a long poll that won a task, before it is
        handed over): if they no longer hold, the call is ended and the refusal raised."""
        if self._recheck is None:
            return
        try:
            self._recheck(True)
        except Unauthenticated as exc:
            self._end(EndReason.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED, str(exc))
            raise
        except PermissionDenied as exc:
            self._end(EndReason.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED, str(exc))
            raise

    def _end_at_max_age(self) -> None:
        self._end(
            EndReason.MAX_AGE,
            grpc.StatusCode.UNAVAILABLE,
            f"stream reached its maximum age ({self._max_age:g} s, max_stream_age); resume "
            "from your last position",
        )

    def _end(self, reason: EndReason, code: grpc.StatusCode, message: str) -> None:
        with self._lock:
            if self._ending is not None:
                return  # the first reason stands
            self._ending = StreamEnding(reason, code, message)
            self._ended_at = self._monotonic()
        self._metrics.count_stream_ended(reason.value)
        log.info("stream ended by the server", principal=self.principal, reason=reason.value)

    def fell_behind(self, message: Callable[[], str]) -> None:
        """The stream's follower fell behind for good (called on its watch's thread). Its
        handler ends the stream RESOURCE_EXHAUSTED with the position to resume after as soon as
        it asks for the next event; one stuck sending to a caller that stopped reading cannot
        ask, and is cut ``stuck_grace`` later with RESOURCE_EXHAUSTED and ``message()`` (read
        then, so it names the last event that left)."""
        with self._lock:
            if self._behind is not None:
                return
            self._behind, self._behind_at = message, self._monotonic()
        self._metrics.count_stream_ended(EndReason.BEHIND.value)
        log.info("stream fell behind", principal=self.principal)

    def _cancel_if_stuck(self, now: float) -> None:
        with self._lock:
            due = None if self._cancelled else self._cut_due(now)
            self._cancelled = self._cancelled or due is not None
        if due is not None:
            # The handler cannot look (blocked in a send the caller does not read, or a stream
            # that never asks): cutting the call is the only way to get its thread back.
            code, message = due
            log.warning("stream did not end in time; cut", principal=self.principal)
            self._metrics.count_stream_ended("cancelled")
            cut(self._context, code, message())

    def _cut_due(self, now: float) -> tuple[grpc.StatusCode, Callable[[], str]] | None:
        """The status to cut the call with, once its end was decided ``stuck_grace`` ago."""
        ending = self._ending
        if ending is not None and now - self._ended_at >= self._stuck_grace:
            return ending.code, lambda: ending.message
        if self._behind is not None and now - self._behind_at >= self._stuck_grace:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, self._behind
        return None


def cut(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> None:
    """End ``context``'s call now with ``code`` and ``message``, whatever its handler is doing.

    From another thread grpc's public ``ServicerContext`` can only cancel, which the caller
    hears as a bare CANCELLED. The core call underneath takes a status: HTTP/2 then sends it
    right after the messages already handed to the transport (every one the caller will read)
    and drops the one stuck behind flow control, so a caller that stopped reading reads what it
    was sent and then ``code``. Only grpc-status and grpc-message go this way (no custom
    trailing metadata), so ``message`` names what the caller needs. Falls back to ``cancel()``
    should grpc's internals move (tests/lifecycle/test_lossless_events.py pins the status).
    """
    call = getattr(getattr(context, "_rpc_event", None), "call", None)  # grpc's own, no API
    if call is None:
        context.cancel()  # type: ignore[no-untyped-call]  # untyped in the stubs
        return
    call.cancel(code.value[0], message)


class OpenStreams:
    """The replica's open long-lived calls, counted in total and per principal."""

    def __init__(
        self,
        limits: StreamLimits,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics = METRICS,
    ) -> None:
        self.limits = limits
        self._monotonic = monotonic
        self._metrics = metrics
        self._lock = threading.Lock()
        self._open: set[StreamGuard] = set()
        self._per_principal: dict[str, int] = {}

    def open(
        self, principal: str, context: grpc.ServicerContext, recheck: Recheck | None
    ) -> StreamGuard:
        """Count one more call of ``principal``; ResourceExhausted naming the bound if full."""
        with self._lock:
            held = self._per_principal.get(principal, 0)
            decision = admission(
                self.limits,
                open_total=len(self._open),
                open_of_principal=held,
                borrows=principal != UNAUTHENTICATED_CALLERS,
            )
            if decision is Admission.ADMITTED:
                guard = StreamGuard(
                    principal=principal,
                    context=context,
                    recheck=recheck,
                    limits=self.limits,
                    monotonic=self._monotonic,
                    metrics=self._metrics,
                )
                self._open.add(guard)
                self._per_principal[principal] = held + 1
                self._metrics.streams_open.inc()
                return guard
        # Counted here; logged by the call log, at most once per principal per interval
        # (coordinator.server.refusal_log): a pool's refused polls must not flood the log.
        self._metrics.count_stream_refused(decision.value)
        raise ResourceExhausted(refusal_message(decision, self.limits, principal))

    def close(self, guard: StreamGuard) -> None:
        """The call ended (however): its slot is free again."""
        with self._lock:
            if guard not in self._open:
                return
            self._open.remove(guard)
            left = self._per_principal[guard.principal] - 1
            if left:
                self._per_principal[guard.principal] = left
            else:
                del self._per_principal[guard.principal]  # no entry kept per past principal
            self._metrics.streams_open.dec()

    def count(self, principal: str | None = None) -> int:
        """Calls open now: all of them, or ``principal``'s."""
        with self._lock:
            if principal is None:
                return len(self._open)
            return self._per_principal.get(principal, 0)

    def sweep(self) -> None:
        """Check every open call once (age, credentials, stuck)."""
        with self._lock:
            guards = list(self._open)
        for guard in guards:
            try:
                guard.check()
            except Exception:  # one call's surprise must not stop the checks of the others
                log.exception("stream check failed", principal=guard.principal)

    def run(self, server: grpc.Server) -> None:
        """Sweep every ``sweep_interval`` until ``server`` terminates (a daemon thread's body)."""
        # wait_for_termination returns True on timeout, False once the server has stopped.
        while server.wait_for_termination(timeout=self.limits.sweep_interval):
            self.sweep()
