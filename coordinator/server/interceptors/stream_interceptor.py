"""The interceptor that admits long-lived calls within their bounds, and what handlers ask.

Registered right after authentication (coordinator.server.app), so the caller's principal is
known; the open services (health, reflection) reach it unauthenticated and share one count
(``streams.UNAUTHENTICATED_CALLERS``). Unary calls pass untouched.

A long-lived handler asks ``stream_alive(context)`` instead of ``context.is_active`` between
events; when it returns, the interceptor ends the call with the guard's status (max age,
revoked credentials) if the server decided to end it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import grpc

from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.domain.roles import Identity
from coordinator.domain.stream_limits import UNAUTHENTICATED_CALLERS
from coordinator.errors import CoordinatorError, Unauthenticated
from coordinator.server.identity import CURRENT_IDENTITY
from coordinator.server.interceptors.auth import Metadata, call_metadata, peer_properties
from coordinator.server.interceptors.handlers import (
    Handler,
    metadata_value,
    rebuilt,
    streams_responses,
)
from coordinator.server.status import status_code_of
from coordinator.server.streams import (
    LONG_POLLS,
    LongPolls,
    OpenStreams,
    Recheck,
    StreamGuard,
    is_long_lived,
)
from coordinator.server.tls import PeerProperties

CURRENT_STREAM: ContextVar[StreamGuard | None] = ContextVar("coordinator_stream", default=None)
"""Set by the interceptor for the handler of a long-lived call; read through ``stream_alive``."""

Check = Callable[[str, Metadata, PeerProperties], Identity]
"""``AuthInterceptor.check``: a call's credentials and role, checked again."""


def stream_alive(context: grpc.ServicerContext) -> Callable[[], bool]:
    """What a long-lived handler polls to know whether to go on (``StreamGuard.alive``);
    ``context.is_active`` for a call the interceptor did not admit (a server built without it)."""
    guard = CURRENT_STREAM.get()
    return context.is_active if guard is None else guard.alive


class CallerOf:
    """``coordinator.store.Caller`` over a gRPC call: there while ``stream_alive`` says so, and
    told of the call's end by gRPC's own end-of-call callback (its poller thread calls it when
    the caller cancels or its deadline passes), not by a periodic look."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self._context = context
        self._alive = stream_alive(context)
        self._guard = CURRENT_STREAM.get()

    def alive(self) -> bool:
        """Whether the answer can still reach the caller: the call is active and its deadline
        (if any) has not passed by this server's clock. gRPC's core marks a call inactive a
        timer tick after its deadline; asking for the time left closes that window, in which
        a claim would be answered to a caller whose deadline had already passed."""
        remaining = self._context.time_remaining()
        if remaining is not None and remaining <= 0:
            return False
        return self._alive()

    def confirm(self) -> None:
        """The caller's credentials checked now, the token file re-read if it changed
        (``StreamGuard.confirm``); nothing for a call the interceptor did not admit."""
        if self._guard is not None:
            self._guard.confirm()

    def on_end(self, callback: Callable[[], None]) -> bool:
        """Run ``callback`` when the call ends; False when it has ended already."""
        return bool(self._context.add_callback(callback))

    def answer_lost(self) -> bool:
        """Once the call ended: whether gRPC's core reported it cancelled (its close came with
        ``cancelled``: the caller cancelled, or its deadline passed, before the status went
        out). grpc's public ``ServicerContext`` cannot tell that from an answer delivered, so
        this reads the call state grpc keeps (``_state.client``: "cancelled" or "closed"),
        as ``streams.cut`` reads its call; False should grpc's internals move, which only
        leaves such a lost answer to expire (tests/workqueue/test_abandoned_polls.py pins it)."""
        state = getattr(self._context, "_state", None)  # grpc's own, no API
        return getattr(state, "client", None) == "cancelled"

    def replayable(self) -> bool:
        """Whether the call carries an idempotency key (its answer is stored for a retry)."""
        return (
            metadata_value(self._context.invocation_metadata(), IDEMPOTENCY_METADATA_KEY)
            is not None
        )


def cut_when_stuck(message: Callable[[], str]) -> Callable[[], None]:
    """``on_behind`` for a follow stream's handler (call it on the handler's thread): counts the
    stream as ended behind, and has the sweep cut it RESOURCE_EXHAUSTED with ``message()`` if
    its thread is still stuck sending (to a client that stopped reading) ``stuck_grace`` later.
    A reader that is merely slow gets there first: its handler ends it RESOURCE_EXHAUSTED with
    the resume position in trailing metadata. Nothing for a call the interceptor did not admit
    (a server built without it has no sweep)."""
    guard = CURRENT_STREAM.get()

    def on_behind() -> None:
        if guard is not None:
            guard.fell_behind(message)

    return on_behind


class StreamLimitInterceptor:
    """Admits each long-lived call into ``streams`` (or refuses it RESOURCE_EXHAUSTED), keeps
    its guard current for its handler, and frees its slot when it ends."""

    def __init__(
        self,
        streams: OpenStreams,
        check: Check,
        *,
        refresh: Callable[[], None] = lambda: None,
        long_polls: LongPolls = LONG_POLLS,
    ) -> None:
        self._streams = streams
        self._check = check
        self._refresh = refresh
        self._long_polls = long_polls

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap the handler of a long-lived method; others pass through."""
        if not is_long_lived(method, handler, long_polls=self._long_polls):
            return handler
        waits = self._long_polls.get(method, _always_waits)
        return _wrap(handler, lambda context: self._admit(method, context), self._streams, waits)

    def _admit(self, method: str, context: grpc.ServicerContext) -> StreamGuard:
        identity = CURRENT_IDENTITY.get()
        if identity is None:  # an open service: no credentials to count or check again
            principal, recheck = UNAUTHENTICATED_CALLERS, None
        else:
            principal = identity.principal
            recheck = self._rechecker(method, identity, context)
        try:
            return self._streams.open(principal, context, recheck)
        except CoordinatorError as exc:
            context.abort(status_code_of(exc), str(exc))

    def _rechecker(self, method: str, identity: Identity, context: grpc.ServicerContext) -> Recheck:
        # Metadata and peer are fixed for the life of a call; the token file is not.
        metadata, peer = call_metadata(context), peer_properties(context)

        def recheck(fresh: bool) -> None:
            if fresh:
                self._refresh()
            now = self._check(method, metadata, peer)
            if now.principal != identity.principal:
                raise Unauthenticated(
                    f"the stream's credentials now name principal {now.principal!r}, not "
                    f"{identity.principal!r}; open a new stream"
                )

        return recheck


def _always_waits(request: Any) -> bool:
    """Every call of a streaming method is long-lived."""
    del request
    return True


def _wrap(
    handler: Handler,
    admit: Callable[[grpc.ServicerContext], StreamGuard],
    streams: OpenStreams,
    waits: Callable[[Any], bool],
) -> Handler:
    """The same handler, admitted first, ended with its guard's status, its slot freed after.
    A unary call whose request does not wait (``waits``) runs as it is, uncounted."""

    def end(guard: StreamGuard, context: grpc.ServicerContext) -> None:
        ending = guard.ending
        if ending is not None and context.is_active():
            context.abort(ending.code, ending.message)

    def streamed(behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]]) -> Any:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            guard = admit(context)
            try:
                CURRENT_STREAM.set(guard)  # the call's own context: nothing to reset
                yield from behavior(request, context)
                end(guard, context)
            finally:
                streams.close(guard)

        return run

    def answered(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Any:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            if handler.unary_unary is not None and not waits(request):
                return behavior(request, context)
            guard = admit(context)
            try:
                CURRENT_STREAM.set(guard)
                response = behavior(request, context)
                end(guard, context)
                return response
            finally:
                streams.close(guard)

        return run

    return rebuilt(
        handler,
        lambda kind, behavior: (
            streamed(behavior) if streams_responses(kind) else answered(behavior)
        ),
    )
