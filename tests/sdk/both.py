"""One face over the sync and the asyncio SDK, so a behavioural test runs against both.

``Sdk.client(...)`` gives a ``Worker`` whose claims come back as ``Held`` claims; for asyncio each
call is run on an event loop in a thread of its own (``LoopThread``), which keeps running between
calls, so the AsyncClaim's keepalive task renews while the test waits, as a real program's would.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, Protocol, TypeVar

import grpc
from grpc import aio

from coordinator.domain.idempotency import IDEMPOTENCY_METADATA_KEY
from coordinator.sdk import (
    CallRetry,
    ClaimRefused,
    CommitOutcome,
    Downstream,
    EffectOutcome,
    FailOutcome,
    LostCallback,
    LostReason,
    ReleaseOutcome,
    StageOutcome,
    TaskInfo,
    TaskRetryPolicy,
    WorkerClient,
)
from coordinator.sdk.aio import AsyncClaim, AsyncWorkerClient, ThreadedDownstream
from tests.conftest import GRPC_OPTIONS

T = TypeVar("T")
CALL_TIMEOUT = 60.0  # no call of a test waits longer than its retry budget and lease


class Held(Protocol):
    """A claim of either SDK, as the tests use it."""

    @property
    def generation(self) -> int: ...
    @property
    def renewals(self) -> int: ...
    @property
    def lost_reason(self) -> LostReason | None: ...
    @property
    def committed(self) -> bool: ...
    @property
    def ttl(self) -> timedelta: ...
    @property
    def previous_checkpoint(self) -> bytes: ...
    @property
    def checkpoint_refusals(self) -> int: ...
    @property
    def last_checkpoint_refusal(self) -> str: ...
    @property
    def checkpoint_pending(self) -> bool: ...
    def is_lost(self) -> bool: ...
    def check(self) -> None: ...
    def remaining(self) -> timedelta: ...
    def checkpoint(self, data: bytes) -> None: ...
    def save_checkpoint(self, data: bytes) -> bool: ...

    def progress(self, marker: str) -> None: ...
    def wait_lost(self, timeout: timedelta) -> bool: ...
    def commit(self, result: bytes) -> CommitOutcome: ...
    def stage(self, result: bytes) -> StageOutcome: ...
    def release(self, reason: str = "") -> ReleaseOutcome: ...
    def fail(
        self, error: BaseException | str, *, retryable: bool = True, delay: timedelta | None = None
    ) -> FailOutcome: ...
    def effect(
        self, node_id: str, effect_slot: str, payload: bytes, downstream: Downstream
    ) -> EffectOutcome: ...
    def __enter__(self) -> Held: ...
    def __exit__(self, *exc: Any) -> None: ...


class Worker(Protocol):
    """A worker client of either SDK."""

    def claim(
        self, task_id: str, *, ttl: timedelta, on_lost: LostCallback | None = None
    ) -> Held | ClaimRefused: ...
    def claim_next(
        self, queue: str, *, ttl: timedelta, wait: timedelta | None = None
    ) -> Held | ClaimRefused: ...
    def create_task(
        self,
        task_id: str,
        *,
        input: bytes,
        queue: str,
        retry_policy: TaskRetryPolicy | None = None,
    ) -> TaskInfo: ...
    def get_task(self, task_id: str) -> TaskInfo: ...
    def epoch(self) -> int: ...
    def close(self) -> None: ...


class LoopThread:
    """An event loop running in its own thread; ``run`` waits for one coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CALL_TIMEOUT)

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CALL_TIMEOUT)
        self.loop.close()


class Sent:
    """The requests a client sent, by method name (``Renew``, ...), oldest first: an
    interceptor of the client's own SDK records them (``Sdk.client(..., sent=...)``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, list[Any]] = {}

    def record(self, method: str | bytes, request: Any) -> None:
        """Keep one request of ``method`` (a full gRPC method path)."""
        name = (method.decode() if isinstance(method, bytes) else method).rsplit("/", 1)[-1]
        with self._lock:
            self._requests.setdefault(name, []).append(request)

    def of(self, name: str) -> list[Any]:
        """The requests of method ``name`` so far."""
        with self._lock:
            return list(self._requests.get(name, ()))

    def renewals(self) -> list[Any]:
        """Every RenewRequest sent, alone (Renew: the asyncio SDK) or in a RenewMany (the sync
        SDK's keepalive loop), oldest first."""
        with self._lock:
            many = [r for batch in self._requests.get("RenewMany", ()) for r in batch.renewals]
            return [*self._requests.get("Renew", ()), *many]


class _SyncRecorder(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, sent: Sent) -> None:
        self._sent = sent

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        self._sent.record(details.method, request)
        return continuation(details, request)


class _AsyncRecorder(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, sent: Sent) -> None:
        self._sent = sent

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        self._sent.record(client_call_details.method, request)
        return await continuation(client_call_details, request)


class LostAnswers:
    """Loses the answer of the first ``count`` tries of ``method`` after the server ran them
    (UNAVAILABLE, as a connection reset on the way back), in either SDK; ``keys`` are the
    idempotency keys every try of ``method`` carried, in order."""

    def __init__(self, method: str, count: int) -> None:
        self.method, self.count = method, count
        self.keys: list[str] = []

    def lose(self, method: str | bytes, metadata: Any) -> bool:
        """Note a try of ``method`` that ran; whether its answer is to be lost."""
        name = (method.decode() if isinstance(method, bytes) else method).rsplit("/", 1)[-1]
        if name != self.method:
            return False
        self.keys.append(dict(metadata or ()).get(IDEMPOTENCY_METADATA_KEY, ""))
        return len(self.keys) <= self.count


def _lost_answer() -> aio.AioRpcError:
    return aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, aio.Metadata(), aio.Metadata(), "the answer was lost", None
    )


class _SyncLoser(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, lost: LostAnswers) -> None:
        self._lost = lost

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        call = continuation(details, request)
        if self._lost.lose(details.method, details.metadata):
            call.result()  # it ran on the server...
            raise _lost_answer()  # ...and its answer never came back
        return call


class _AsyncLoser(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, lost: LostAnswers) -> None:
        self._lost = lost

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        call = await continuation(client_call_details, request)
        if self._lost.lose(client_call_details.method, client_call_details.metadata):
            await call
            raise _lost_answer()
        return call


class _AsyncHeld:
    """An AsyncClaim driven from the test's thread."""

    def __init__(self, claim: AsyncClaim, loop: LoopThread) -> None:
        self.claim, self._loop = claim, loop

    generation = property(lambda self: self.claim.generation)
    renewals = property(lambda self: self.claim.renewals)
    lost_reason = property(lambda self: self.claim.lost_reason)
    committed = property(lambda self: self.claim.committed)
    ttl = property(lambda self: self.claim.ttl)
    previous_checkpoint = property(lambda self: self.claim.previous_checkpoint)
    checkpoint_refusals = property(lambda self: self.claim.checkpoint_refusals)
    last_checkpoint_refusal = property(lambda self: self.claim.last_checkpoint_refusal)
    checkpoint_pending = property(lambda self: self.claim.checkpoint_pending)

    def is_lost(self) -> bool:
        return self.claim.is_lost()

    def check(self) -> None:
        self.claim.check()

    def remaining(self) -> timedelta:
        return self.claim.remaining()

    def checkpoint(self, data: bytes) -> None:
        self.claim.checkpoint(data)

    def save_checkpoint(self, data: bytes) -> bool:
        return self._loop.run(self.claim.save_checkpoint(data))

    def progress(self, marker: str) -> None:
        self.claim.progress(marker)

    def wait_lost(self, timeout: timedelta) -> bool:
        return self._loop.run(self.claim.wait_lost(timeout))

    def commit(self, result: bytes) -> CommitOutcome:
        return self._loop.run(self.claim.commit(result))

    def stage(self, result: bytes) -> StageOutcome:
        return self._loop.run(self.claim.stage(result))

    def release(self, reason: str = "") -> ReleaseOutcome:
        return self._loop.run(self.claim.release(reason))

    def fail(
        self, error: BaseException | str, *, retryable: bool = True, delay: timedelta | None = None
    ) -> FailOutcome:
        return self._loop.run(self.claim.fail(error, retryable=retryable, delay=delay))

    def effect(
        self, node_id: str, effect_slot: str, payload: bytes, downstream: Downstream
    ) -> EffectOutcome:
        threaded = ThreadedDownstream(downstream)
        return self._loop.run(self.claim.effect(node_id, effect_slot, payload, threaded))

    def __enter__(self) -> _AsyncHeld:
        self._loop.run(self.claim.__aenter__())
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._loop.run(self.claim.__aexit__(exc_type, exc, tb))


class _AsyncWorker:
    """An AsyncWorkerClient driven from the test's thread."""

    def __init__(
        self,
        loop: LoopThread,
        target: str,
        principal: str,
        policy: CallRetry,
        interceptors: Sequence[aio.UnaryUnaryClientInterceptor[Any, Any]],
    ) -> None:
        self._loop = loop

        async def connect() -> AsyncWorkerClient:  # a grpc.aio channel is made on its loop
            return AsyncWorkerClient(
                target,
                principal=principal,
                channel_options=GRPC_OPTIONS,
                retry=policy,
                interceptors=interceptors,
            )

        self.client = loop.run(connect())

    def _held(self, claimed: AsyncClaim | ClaimRefused) -> Held | ClaimRefused:
        return claimed if isinstance(claimed, ClaimRefused) else _AsyncHeld(claimed, self._loop)

    def claim(
        self, task_id: str, *, ttl: timedelta, on_lost: LostCallback | None = None
    ) -> Held | ClaimRefused:
        return self._held(self._loop.run(self.client.claim(task_id, ttl=ttl, on_lost=on_lost)))

    def claim_next(
        self, queue: str, *, ttl: timedelta, wait: timedelta | None = None
    ) -> Held | ClaimRefused:
        return self._held(self._loop.run(self.client.claim_next(queue, ttl=ttl, wait=wait)))

    def create_task(
        self,
        task_id: str,
        *,
        input: bytes,
        queue: str,
        retry_policy: TaskRetryPolicy | None = None,
    ) -> TaskInfo:
        create = self.client.create_task(
            task_id, input=input, queue=queue, retry_policy=retry_policy
        )
        return self._loop.run(create)

    def get_task(self, task_id: str) -> TaskInfo:
        return self._loop.run(self.client.get_task(task_id))

    def epoch(self) -> int:
        return self._loop.run(self.client.epoch())

    def close(self) -> None:
        self._loop.run(self.client.close())


class Sdk:
    """Makes worker clients of one SDK: ``sync`` or ``async``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._loop = LoopThread() if kind == "async" else None
        self._workers: list[Worker] = []

    def client(
        self,
        target: str | Sequence[str],
        principal: str,
        *,
        retry: CallRetry | None = None,
        sent: Sent | None = None,
        lost: LostAnswers | None = None,
    ) -> Worker:
        """A client of this SDK, closed with the Sdk; ``sent`` records every request it
        sends, ``lost`` loses the answers it says."""
        policy = retry or CallRetry(attempts=3)
        worker: Worker
        if self._loop is None:
            sync: list[grpc.UnaryUnaryClientInterceptor[Any, Any]] = []
            sync += [_SyncRecorder(sent)] if sent is not None else []
            sync += [_SyncLoser(lost)] if lost is not None else []
            worker = WorkerClient(
                target,
                principal=principal,
                channel_options=GRPC_OPTIONS,
                retry=policy,
                interceptors=sync,
            )
        else:
            chain: list[aio.UnaryUnaryClientInterceptor[Any, Any]] = []
            chain += [_AsyncRecorder(sent)] if sent is not None else []
            chain += [_AsyncLoser(lost)] if lost is not None else []
            worker = _AsyncWorker(self._loop, str(target), principal, policy, chain)
        self._workers.append(worker)
        return worker

    def close(self) -> None:
        """Close every client, then the loop."""
        for worker in self._workers:
            worker.close()
        if self._loop is not None:
            self._loop.close()
