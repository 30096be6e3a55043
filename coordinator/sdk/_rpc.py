"""The SDK's transport: one channel, the three service stubs, deadlines, retries.

The decisions are pure and shared with the asyncio transport (coordinator.sdk.aio): the policy
(``CallRetry``), what a status means (sdk/_status.py), and one call's tries (``CallPlan``), in
sdk/_core/calls.py; ``Rpc`` only sends the tries on a sync channel.

Every call carries the caller's principal in metadata and a deadline. Transport failures
(UNAVAILABLE, DEADLINE_EXCEEDED) and refusals at a replica's concurrency bound
(RESOURCE_EXHAUSTED) are retried with exponential backoff for as long as the call's
time allows (sdk/_budget.py: the retry budget, and the lease for a call behind a claim's fence);
every other status is final and becomes one of the coordinator's exceptions. A call given up
after a try that may have reached a coordinator raises OutcomeUnknown, saying what to repeat.

Why retrying is safe: every worker call is idempotent per attempt. A renew only keeps the same
lease alive; a repeated commit of the same attempt and digest answers COMMITTED again (the
contract says so); a repeated stage overwrites the attempt's own staging key with the same
bytes; authorize writes nothing; a repeated release answers FENCED/RELEASED without a second
transition. A claim is the exception: every Claim / ClaimNext (and Commit with ``next``) carries
an idempotency key of its own, one per logical call, so a retry whose first try landed gets that
try's answer, the same attempt, instead of starting another (ABORTED, the first try still
running, is retried too). Task creation is retried only with an explicit task id or a key.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import grpc
from tenacity import Retrying, nap

from coordinator.sdk._core.calls import Caller, CallPlan, CallRetry, Req, Resp, Tries
from coordinator.sdk._target import Endpoints
from coordinator.sdk.abort import Abort, CallAborted
from coordinator.v1 import admin_pb2_grpc, tasks_pb2_grpc, worker_pb2_grpc


class Rpc(Caller):
    """A channel to the coordinator's replicas with its stubs, metadata and retry policy."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        principal: str,
        retry: CallRetry,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor[Any, Any]] = (),
        clock: Callable[[], float] = time.monotonic,
        pick: Callable[[int], int] = random.randrange,
    ) -> None:
        super().__init__(
            target,
            principal=principal,
            retry=retry,
            channel_options=channel_options,
            clock=clock,
            pick=pick,
        )
        self._channels = [
            grpc.secure_channel(t, credentials, options=self._options)
            if credentials is not None
            else grpc.insecure_channel(t, options=self._options)
            for t in self.targets
        ]
        self.endpoints = Endpoints(self._channels, first=self.first)
        channel = grpc.intercept_channel(cast(grpc.Channel, self.endpoints.channel), *interceptors)
        self.worker = worker_pb2_grpc.WorkerServiceStub(channel)
        self.tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        self.admin = admin_pb2_grpc.AdminServiceStub(channel)

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        *,
        retry: bool = True,
        timeout: float | None = None,
        idempotency_key: str = "",
        lease_left: timedelta | None = None,
        hint: str = "",
        tries: Tries | None = None,
        abort: Abort | None = None,
    ) -> Resp:
        """Call ``method`` with the deadline, the principal and (if ``retry``) the retries;
        an ``idempotency_key`` goes with every try, so the server replays a landed one.
        ``abort``: ``abort.abort()`` ends the call at once (CallAborted).

        ``lease_left``: the call is made behind a claim's fence with this much lease left, and
        stops retrying when it runs out, before the budget if sooner. ``hint`` replaces what an
        OutcomeUnknown tells the caller to repeat. ``tries`` (if given) counts the tries made.

        Raises OutcomeUnknown when a failed try may have reached a coordinator, TransportError
        when none did, the mapped exception for any other status.
        """
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
            return _send(method, request, plan.per_try, plan.metadata, abort)
        except grpc.RpcError as exc:
            plan.first_failed(exc, self.endpoints, at)
        try:
            sleep = abort.sleep if abort is not None else nap.sleep
            answer: Resp = Retrying(sleep=sleep, **plan.controls())(
                _retry_once, plan, self.endpoints, method, request, abort
            )
        except grpc.RpcError as exc:
            raise plan.given_up(exc) from exc
        return answer

    def close(self) -> None:
        """Close the channels; calls in flight fail with CANCELLED."""
        for channel in self._channels:
            channel.close()


def _send(
    method: grpc.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    timeout: float | None,
    metadata: tuple[tuple[str, str], ...],
    abort: Abort | None,
) -> Resp:
    """One try of a call; with ``abort``, as a future that ``abort.abort()`` cancels."""
    if abort is None:
        return method(request, timeout=timeout, metadata=metadata)
    if abort.aborted():
        raise CallAborted("the call was aborted before it was sent")
    call = method.future(request, timeout=timeout, metadata=metadata)
    with abort.watching(call):
        try:
            return call.result()
        except grpc.FutureCancelledError as exc:
            raise CallAborted("the call was aborted in flight") from exc


def _retry_once(
    plan: CallPlan,
    endpoints: Endpoints,
    method: grpc.UnaryUnaryMultiCallable[Req, Resp],
    request: Req,
    abort: Abort | None = None,
) -> Resp:
    """One retry of a sync call (tenacity calls it); a failed one moves the client on."""
    timeout = plan.next_timeout()
    at = endpoints.current
    try:
        return _send(method, request, timeout, plan.metadata, abort)
    except grpc.RpcError as exc:
        plan.failed(exc, endpoints, at)
        raise
