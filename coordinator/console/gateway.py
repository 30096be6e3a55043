"""The console's only way to the coordinator: gRPC calls made with the signed-in person's
credentials through the SDK's transport (deadline, retries on UNAVAILABLE only, one exception
per status). One channel per page or action, closed after it: a console serves people, not a
hot path, and a channel of one person's token is never shared with another's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import grpc

from coordinator.console.session import Credentials
from coordinator.console.settings import ConsoleSettings
from coordinator.sdk import PRINCIPAL_METADATA, CallRetry
from coordinator.sdk._rpc import Rpc
from coordinator.sdk._status import translate
from coordinator.sdk.auth import BearerToken
from coordinator.v1 import tasks_pb2

# grpc honours $http_proxy; a console reaches its coordinator directly.
_CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]


class Gateway:
    """Opens calls to one coordinator for one person at a time."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self._settings = settings

    @contextmanager
    def connect(self, credentials: Credentials) -> Iterator[Rpc]:
        """A transport carrying ``credentials`` (its token on every unary and streaming call)."""
        timeout = timedelta(seconds=self._settings.rpc_timeout)
        rpc = Rpc(
            self._settings.target,
            principal=credentials.principal,
            retry=CallRetry(timeout=timeout, budget=timeout, attempts=2),
            credentials=self._settings.channel_credentials,
            channel_options=_CHANNEL_OPTIONS,
            interceptors=[BearerToken(credentials.token)] if credentials.token else (),
        )
        try:
            yield rpc
        finally:
            rpc.close()

    @contextmanager
    def watch(
        self, credentials: Credentials, request: tasks_pb2.WatchEventsRequest, *, timeout: float
    ) -> Iterator[Iterator[tasks_pb2.TaskEvent]]:
        """A WatchEvents stream ending by ``timeout``; leaving the block cancels it, which also
        wakes a thread blocked waiting for the next event. A refusal surfaces from iteration as
        the coordinator's exception (``translate``)."""
        with self.connect(credentials) as rpc:
            call: Any = rpc.tasks.WatchEvents(
                request, timeout=timeout, metadata=((PRINCIPAL_METADATA, credentials.principal),)
            )
            try:
                yield _translated(call)
            finally:
                call.cancel()


def _translated(call: Iterator[tasks_pb2.TaskEvent]) -> Iterator[tasks_pb2.TaskEvent]:
    try:
        yield from call
    except grpc.RpcError as exc:
        if exc.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED):
            return  # we ended it (the viewer left, or the stream's time is up)
        raise translate(exc) from exc
