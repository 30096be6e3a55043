"""The asyncio SDK's transport: a ``grpc.aio`` channel, its stubs, and the sync SDK's retries.

Everything but the sending is shared with the sync transport (sdk/_core/calls.py): the
policy, the request id and metadata of a call, which failures are retried for how long
(``CallPlan``), and what a call given up raises (OutcomeUnknown / TransportError).
tenacity's ``AsyncRetrying`` sleeps with ``asyncio.sleep``, so a call waiting out its backoff
never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import timedelta
from typing import Any, TypeAlias, cast

import grpc
from grpc import aio
from tenacity import AsyncRetrying

from coordinator.sdk._core.calls import Caller, CallPlan, CallRetry, Req, Resp, Tries
from coordinator.sdk._target import Endpoints
from coordinator.sdk.auth import bearer_header
from coordinator.v1 import admin_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc

# A string: the async stub exists only in the generated type stubs, not at runtime.
AsyncWorkerMethod: TypeAlias = (
    "Callable[[worker_pb2_grpc.WorkerServiceAsyncStub], aio.UnaryUnaryMultiCallable[Req, Resp]]"
)
"""Picks the WorkerService method to call, e.g. ``lambda worker: worker.Commit``."""


class AsyncRpc(Caller):
    """A ``grpc.aio`` channel to the coordinator's replicas with its stubs and retry policy.

    Made on the event loop that uses it: a ``grpc.aio`` channel belongs to one loop.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        principal: str,
        retry: CallRetry,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        interceptors: Sequence[aio.UnaryUnaryClientInterceptor[Any, Any]] = (),
        clock: Callable[[], float] = time.monotonic,
        pick: Callable[[int], int] = random.randrange,
    ) -> None:
        # Every call goes through ``call``, so the token rides in its metadata (the sync SDK
        # needs an interceptor because its CLI also opens streams on the channel).
        super().__init__(
            target,
            principal=principal,
            retry=retry,
            channel_options=channel_options,
            clock=clock,
            metadata=() if token is None else (bearer_header(token),),
            pick=pick,
        )
        # The stubs leave aio.ClientInterceptor untyped: every unary interceptor is one.
        chain = cast(Sequence[aio.ClientInterceptor], interceptors)
        self._channels = [
            aio.secure_channel(t, credentials, options=self._options, interceptors=chain)
            if credentials is not None
            else aio.insecure_channel(t, options=self._options, interceptors=chain)
            for t in self.targets
        ]
        # One channel per replica given, a retry moving on to the next (sdk/_target.py).
        self.endpoints = Endpoints(self._channels, first=self.first)
        channel = cast(aio.Channel, self.endpoints.channel)
        # The generated stubs are typed as their async variants on an aio channel.
        self.worker = worker_pb2_grpc.WorkerServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)

    async def call(
        self,
        method: aio.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        *,
        retry: bool = True,
        timeout: float | None = None,
        idempotency_key: str = "",
        lease_left: timedelta | None = None,
        hint: str = "",
        tries: Tries | None = None,
        heard: Callable[[Any], None] | None = None,
    ) -> Resp:
        """Call ``method`` as the sync ``Rpc.call`` does (same deadlines, retries, request id,
        idempotency key, errors and ``tries``), awaiting every try and backoff. ``heard`` gets
        an answer that came as the caller was cancelled (``_answer``)."""
        plan = self._plan(
            request,
            retry=retry,
            timeout=timeout,
            idempotency_key=idempotency_key,
            lease_left=lease_left,
            hint=hint,
            tries=tries,
        )
        at = self.endpoints.current
        try:
            call = method(request, timeout=plan.per_try, metadata=plan.metadata)
            return cast(Resp, await _answer(call, heard))
        except grpc.RpcError as exc:
            plan.first_failed(exc, self.endpoints, at)
        try:
            answer: Resp = await AsyncRetrying(**plan.controls())(
                _retry_once, plan, self.endpoints, method, request, heard
            )
        except grpc.RpcError as exc:
            raise plan.given_up(exc) from exc
        return answer

    async def close(self) -> None:
        """Close the channels; calls in flight fail with CANCELLED."""
        for channel in self._channels:
            await channel.close(None)


async def _answer(call: Any, heard: Callable[[Any], None] | None) -> Any:
    """``await call``. A caller cancelled as the answer came (it was in, the caller had not
    resumed yet) drops it; ``heard`` gets it instead (a claim's: to give back what it won)."""
    try:
        return await call
    except asyncio.CancelledError:
        if heard is not None and call.done() and not call.cancelled():
            with suppress(grpc.RpcError):
                heard(await call)  # done: the answer at once, no wait
        raise


async def _retry_once(
    plan: CallPlan,
    endpoints: Endpoints,
    method: aio.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    heard: Callable[[Any], None] | None = None,
) -> Resp:
    """One retry of an asyncio call (tenacity awaits it); a failed one moves the client on."""
    timeout = plan.next_timeout()
    at = endpoints.current
    try:
        return cast(
            Resp, await _answer(method(request, timeout=timeout, metadata=plan.metadata), heard)
        )
    except grpc.RpcError as exc:
        plan.failed(exc, endpoints, at)
        raise
