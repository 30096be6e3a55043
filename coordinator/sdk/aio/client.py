"""AsyncWorkerClient: claims tasks and hands back AsyncClaims; the producer calls a worker needs.

The asyncio twin of ``WorkerClient`` (sdk/client.py), with the same requests and answers
(sdk/_core/requests.py), flows (sdk/_core/flows.py), retries and errors (sdk/_rpc.py). It pins
the scheduler epoch it first sees; a claim refused FENCED/EPOCH_CHANGED re-reads it and, if it
moved on, is sent once more under the new one. Held claims keep the epoch they were claimed
under.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import grpc
from grpc import aio

from coordinator.domain.states import Outcome
from coordinator.errors import AlreadyExists, NotFound
from coordinator.sdk._core.calls import CallRetry, Tries
from coordinator.sdk._core.flows import (
    ClaimPoint,
    CreateCall,
    Flow,
    ReadEpoch,
    ReadTask,
    claim_next_point,
    claim_point,
    claiming,
    create_or_existing,
    first_of,
)
from coordinator.sdk._core.held import LostCallback
from coordinator.sdk._core.requests import (
    CLAIM_HINT,
    AnyClaim,
    claim_key,
    create_request,
    lease_clock_start,
)
from coordinator.sdk._duration import Duration
from coordinator.sdk.aio._renewer import AsyncRenewer
from coordinator.sdk.aio._rpc import AsyncRpc
from coordinator.sdk.aio.claim import AsyncClaim, async_claims_of
from coordinator.sdk.aio.producer import AsyncProducerCalls
from coordinator.sdk.aio.unheard import Unheard
from coordinator.sdk.environment import connection
from coordinator.sdk.tasks import TaskInfo, TaskRetryPolicy
from coordinator.sdk.types import ClaimRefused, outcome_of
from coordinator.v1 import admin_pb2, tasks_pb2, worker_pb2


class AsyncWorkerClient(AsyncProducerCalls):
    """A ``grpc.aio`` connection to a coordinator, acting as one principal.

    ``target``, ``credentials``, ``token``, ``retry`` and ``interceptors`` (``grpc.aio`` ones
    here) mean what they mean for ``WorkerClient``, read from the same ``COORDINATOR_*``
    environment when not passed (sdk/environment.py): every call has a deadline and is retried on
    UNAVAILABLE / DEADLINE_EXCEEDED / RESOURCE_EXHAUSTED for up to ``CallRetry.budget``
    (behind a claim's fence, no longer than the lease); a call given up after a try that may
    have landed raises OutcomeUnknown, one no try of which reached a coordinator a plain
    TransportError; a claim's retry gets the same attempt as a lost answer carried.

    Make it inside the event loop that uses it (``async with AsyncWorkerClient(...)``).
    """

    def __init__(
        self,
        target: str | Sequence[str] | None = None,
        *,
        principal: str,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        retry: CallRetry | None = None,
        token: str | None = None,
        interceptors: Sequence[aio.UnaryUnaryClientInterceptor[Any, Any]] = (),
    ) -> None:
        chosen = connection(target, token=token, credentials=credentials)
        self._rpc = AsyncRpc(
            chosen.target,
            principal=principal,
            retry=retry or CallRetry(),
            channel_options=channel_options,
            credentials=chosen.credentials,
            token=chosen.token,
            interceptors=interceptors,
        )
        self._epoch: int | None = None
        # One keepalive task renews every claim of this client (sdk/aio/_renewer.py).
        self._renewer = AsyncRenewer(self._rpc)
        self._unheard = Unheard(self._rpc)

    @property
    def principal(self) -> str:
        """The principal every call is made as."""
        return self._rpc.principal

    # --- epoch ------------------------------------------------------------------------------

    async def epoch(self) -> int:
        """Read the scheduler epoch and pin it for this client's later claims (a claim refused
        FENCED/EPOCH_CHANGED does this by itself)."""
        response = await self._rpc.call(self._rpc.admin.GetEpoch, admin_pb2.GetEpochRequest())
        self._epoch = response.epoch
        return response.epoch

    # --- claims -----------------------------------------------------------------------------

    async def claim(
        self,
        task_id: str,
        *,
        ttl: Duration,
        expected_state_version: int = 0,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
    ) -> AsyncClaim | ClaimRefused:
        """Claim one task: an AsyncClaim (``async with`` it to run the keepalive) or the typed
        refusal; as ``WorkerClient.claim``."""
        point = claim_point(task_id, ttl=ttl, expected_state_version=expected_state_version)
        return first_of(await self._claimed(point, on_lost, safety_margin))

    async def claim_next(
        self,
        queue: str = "default",
        *,
        ttl: Duration,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        wait: Duration | None = None,
    ) -> AsyncClaim | ClaimRefused:
        """Claim the next ready task of ``queue``; NO_READY_TASK comes back as a ClaimRefused.
        Like ``claim``, it follows a new epoch by itself.

        With ``wait`` (at most the server's max_claim_wait, 20 s by default) it is a long poll,
        as ``WorkerClient.claim_next``: the server waits that long for a task to become ready;
        only this coroutine waits, never the loop."""
        point = claim_next_point(queue, ttl=ttl, wait=wait, call_timeout=self._rpc.policy.timeout)
        return first_of(await self._claimed(point, on_lost, safety_margin))

    async def claim_many(
        self,
        queue: str = "default",
        *,
        ttl: Duration,
        max_tasks: int,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        wait: Duration | None = None,
    ) -> list[AsyncClaim] | ClaimRefused:
        """Claim up to ``max_tasks`` (at most 64) ready tasks of ``queue`` in one call, each a
        claim of its own; the refusal (NO_READY_TASK, ...) when it won none. As
        ``WorkerClient.claim_many``: ``wait`` long-polls for the first task, the others are
        whatever is ready then."""
        point = claim_next_point(
            queue, ttl=ttl, wait=wait, call_timeout=self._rpc.policy.timeout, max_tasks=max_tasks
        )
        return await self._claimed(point, on_lost, safety_margin)

    async def _claimed(
        self, point: ClaimPoint, on_lost: LostCallback | None, safety_margin: Duration | None
    ) -> list[AsyncClaim] | ClaimRefused:
        """The claims one claim call won, or its refusal (``claiming``: under the pinned epoch,
        following a new one once)."""
        flow = Flow(claiming(point, self._epoch))
        while (step := flow.step) is not None:
            if isinstance(step, ReadEpoch):
                flow.answer(await self.epoch())
            else:
                method = point.method(self._rpc.worker)
                flow.answer(await self._send_claim(method, step.request, point.timeout))
        response, sent_at = flow.result
        if outcome_of(response.outcome) is not Outcome.CLAIMED:
            return ClaimRefused.from_proto(response)
        return async_claims_of(
            self._rpc,
            response,
            sent_at=sent_at,
            on_lost=on_lost,
            safety_margin=safety_margin,
            renewer=self._renewer,
        )

    async def _send_claim(
        self,
        method: aio.UnaryUnaryMultiCallable[Any, worker_pb2.ClaimResponse],
        request: AnyClaim,
        timeout: float | None,
    ) -> tuple[worker_pb2.ClaimResponse, float]:
        """A claim sent as one call under a key of its own (``claim_key``: a re-pinned request
        is another call): its answer, and when its lease clock starts (``lease_clock_start``)."""
        sent_at, tries = time.monotonic(), Tries()
        response = await self._rpc.call(
            method,
            request,
            hint=CLAIM_HINT,
            timeout=timeout,
            idempotency_key=claim_key(),
            tries=tries,
            heard=self._unheard.give_back,  # an answer that came as this caller was cancelled
        )
        return response, lease_clock_start(sent_at, time.monotonic(), timeout, tries=tries.count)

    # --- tasks ------------------------------------------------------------------------------

    async def create_task(
        self,
        task_id: str = "",
        *,
        input: bytes = b"",
        queue: str = "default",
        priority: int = 0,
        requires_review: bool = False,
        non_replayable: bool = False,
        idempotency_key: str = "",
        retry_policy: TaskRetryPolicy | None = None,
        not_before: datetime | None = None,
        schedule_to_close: Duration | None = None,
        depends_on: Sequence[str] | None = (),
    ) -> TaskInfo:
        """Create a READY task; as ``WorkerClient.create_task`` (retried only with an explicit
        id or an ``idempotency_key``; with an id, the same task found existing is returned;
        ``retry_policy``, ``not_before``, ``schedule_to_close`` and ``depends_on`` as there)."""
        request = create_request(
            task_id,
            input=input,
            queue=queue,
            priority=priority,
            requires_review=requires_review,
            non_replayable=non_replayable,
            retry_policy=retry_policy,
            not_before=not_before,
            schedule_to_close=schedule_to_close,
            depends_on=depends_on,
        )
        flow = Flow(create_or_existing(task_id, request, idempotency_key))
        while (step := flow.step) is not None:
            flow.answer(await self._create_step(step))
        return flow.result

    async def _create_step(self, step: CreateCall | ReadTask) -> Any:
        """Perform one step of ``create_or_existing``; the refusal it decides on as a value."""
        if isinstance(step, ReadTask):
            try:
                return await self.get_task(step.task_id)
            except NotFound:
                return None
        try:
            return await self._rpc.call(
                self._rpc.tasks.CreateTask,
                step.request,
                retry=step.retry,
                idempotency_key=step.idempotency_key,
                hint=step.hint,
            )
        except AlreadyExists as taken:
            return taken

    async def get_task(self, task_id: str) -> TaskInfo:
        """The task and its latest attempts, oldest first (at most 20). Raises NotFound for an
        unknown id."""
        response = await self._rpc.call(
            self._rpc.tasks.GetTask, tasks_pb2.GetTaskRequest(task_id=task_id)
        )
        return TaskInfo.from_proto(response.task, tuple(response.attempts))

    # --- lifetime ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop the keepalive task and close the channel. Claims of this client still held
        stop renewing and will be lost."""
        await self._unheard.close()
        await self._renewer.close()
        await self._rpc.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncWorkerClient({self._rpc.target!r}, principal={self.principal!r})"
