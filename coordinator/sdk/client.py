"""WorkerClient: claims tasks and hands back Claims; also the producer's calls (inherited from
sdk/producer.py), and the operator's calls apart behind ``client.admin`` (sdk/admin.py).

A client pins the scheduler epoch it first sees (``epoch()`` reads and re-pins it). A new epoch
is the operator's decision and a worker must follow it, so a claim refused FENCED/EPOCH_CHANGED
re-reads the epoch and, if it moved on, is sent once more under the new one: the caller does
nothing. What the bump retires is every claim already held: a Claim keeps the epoch it was
claimed under, and its renew, authorize and commit stay FENCED/EPOCH_CHANGED.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

import grpc

from coordinator.domain.effects import EffectState
from coordinator.domain.jobs import JobRecord
from coordinator.sdk._core.calls import CallRetry, Tries
from coordinator.sdk._core.flows import (
    ClaimPoint,
    Flow,
    ReadEpoch,
    claim_next_point,
    claim_point,
    claiming,
    first_of,
)
from coordinator.sdk._core.requests import (
    CLAIM_HINT,
    AnyClaim,
    claim_key,
    lease_clock_start,
)
from coordinator.sdk._duration import Duration
from coordinator.sdk._renewer import Renewer
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.abort import Abort
from coordinator.sdk.admin import AdminCalls
from coordinator.sdk.auth import BearerToken
from coordinator.sdk.claim import Claim, LostCallback, claims_of
from coordinator.sdk.effects import EffectInfo
from coordinator.sdk.environment import connection
from coordinator.sdk.managed import DEFAULT_GRACE, settle
from coordinator.sdk.producer import ProducerCalls
from coordinator.sdk.rediscover import (
    ListedJob,
    Rediscovered,
    kill_orphans,
    list_jobs,
    rediscover,
    resume_claim,
)
from coordinator.sdk.types import ClaimRefused
from coordinator.v1 import admin_pb2, types_pb2, worker_pb2


class WorkerClient(ProducerCalls):
    """A connection to a coordinator, acting as one principal.

    ``target`` is one ``host:port``, several replicas (a list, or comma-separated ``ip:port``s),
    or a gRPC URI such as ``dns:///coordinator.example:7070`` (every address the name resolves
    to); the client sticks to one replica and moves to another when it fails (sdk/_target.py).

    ``target``, ``token`` (a bearer token: the server then ignores ``principal``) and TLS
    ``credentials`` not passed come from the CLI's ``COORDINATOR_*`` variables (sdk/environment.py).

    Every call has a deadline and is retried on UNAVAILABLE / DEADLINE_EXCEEDED (and on
    RESOURCE_EXHAUSTED: a replica at its concurrency bound ran nothing) only, for up to
    ``CallRetry.budget`` (15 s by default) and, behind a claim's fence, no longer than the lease
    lasts; other gRPC errors raise the coordinator's exceptions (NotFound, ...). A call given
    up after a try that may have landed raises OutcomeUnknown (a TransportError) saying what to
    repeat to learn its outcome. Every claim call carries an idempotency key of its own: a
    retry of one whose answer was lost gets that answer, the same attempt, not a second one.
    """

    def __init__(
        self,
        target: str | Sequence[str] | None = None,
        *,
        principal: str,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        retry: CallRetry | None = None,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor[Any, Any]] = (),
        token: str | None = None,
    ) -> None:
        chosen = connection(
            target,
            token=token,
            credentials=credentials,
            token_given=any(isinstance(i, BearerToken) for i in interceptors),
        )
        if chosen.token is not None:
            interceptors = [BearerToken(chosen.token), *interceptors]
        self._rpc = Rpc(
            chosen.target,
            principal=principal,
            retry=retry or CallRetry(),
            channel_options=channel_options,
            credentials=chosen.credentials,
            interceptors=interceptors,
        )
        self._epoch: int | None = None
        self._epoch_lock = threading.Lock()
        # One keepalive loop renews every claim of this client (sdk/_renewer.py).
        self._renewer = Renewer(self._rpc)
        self._admin = AdminCalls(self._rpc)

    @property
    def principal(self) -> str:
        """The principal every call is made as."""
        return self._rpc.principal

    @property
    def admin(self) -> AdminCalls:
        """The operator's calls (bump_epoch, approve_retry) on this connection; the server
        allows them to the admin role only."""
        return self._admin

    # --- epoch ------------------------------------------------------------------------------

    def epoch(self, *, abort: Abort | None = None) -> int:
        """Read the scheduler epoch and pin it for this client's later claims (a claim refused
        FENCED/EPOCH_CHANGED does this by itself); ``abort`` ends the read at once."""
        request = admin_pb2.GetEpochRequest()
        response = self._rpc.call(self._rpc.admin.GetEpoch, request, abort=abort)
        with self._epoch_lock:
            self._epoch = response.epoch
        return response.epoch

    # --- claims -----------------------------------------------------------------------------

    def claim(
        self,
        task_id: str,
        *,
        ttl: Duration,
        expected_state_version: int = 0,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
    ) -> Claim | ClaimRefused:
        """Claim one task. A Claim (enter it to start the keepalive) or the typed refusal.

        ``expected_state_version`` (non-zero) makes the claim conditional on the task's
        state_version; ``on_lost`` is called once if the claim is lost later. Refused because the
        epoch moved on (FENCED/EPOCH_CHANGED), it re-pins the new epoch and claims once more.
        """
        point = claim_point(task_id, ttl=ttl, expected_state_version=expected_state_version)
        return first_of(self._claimed(point, on_lost, safety_margin))

    def claim_next(
        self,
        queue: str = "default",
        *,
        ttl: Duration,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        wait: Duration | None = None,
        abort: Abort | None = None,
    ) -> Claim | ClaimRefused:
        """Claim the next ready task of ``queue``; NO_READY_TASK comes back as a ClaimRefused.
        Like ``claim``, it follows a new epoch by itself.

        With ``wait`` (at most the server's max_claim_wait, 20 s by default) it is a long poll:
        the server waits that long for a task to become ready and answers with the first one
        it wins, so a worker loop needs no sleep between empty claims. ``abort.abort()``
        (sdk/abort.py) ends it at once from another thread: CallAborted."""
        point = claim_next_point(queue, ttl=ttl, wait=wait, call_timeout=self._rpc.policy.timeout)
        return first_of(self._claimed(point, on_lost, safety_margin, abort))

    def claim_many(
        self,
        queue: str = "default",
        *,
        ttl: Duration,
        max_tasks: int,
        on_lost: LostCallback | None = None,
        safety_margin: Duration | None = None,
        wait: Duration | None = None,
        abort: Abort | None = None,
    ) -> list[Claim] | ClaimRefused:
        """Claim up to ``max_tasks`` (at most 64) ready tasks of ``queue`` in one call, each a
        claim of its own; the refusal (NO_READY_TASK, ...) when it won none. ``wait`` long-polls
        for the first task, and ``abort`` ends it, as in ``claim_next``; the others are whatever
        is ready then."""
        point = claim_next_point(
            queue, ttl=ttl, wait=wait, call_timeout=self._rpc.policy.timeout, max_tasks=max_tasks
        )
        return self._claimed(point, on_lost, safety_margin, abort)

    def _claimed(
        self,
        point: ClaimPoint,
        on_lost: LostCallback | None,
        safety_margin: Duration | None,
        abort: Abort | None = None,
    ) -> list[Claim] | ClaimRefused:
        """The claims one claim call won, or its refusal (``claiming``: under the pinned epoch,
        following a new one once)."""
        with self._epoch_lock:
            pinned = self._epoch
        flow = Flow(claiming(point, pinned))
        while (step := flow.step) is not None:
            if isinstance(step, ReadEpoch):  # a claim's abort ends this read too
                flow.answer(self.epoch(abort=abort))
            else:
                method = point.method(self._rpc.worker)
                flow.answer(self._send_claim(method, step.request, point.timeout, abort))
        response, sent_at = flow.result
        won = claims_of(
            self._rpc,
            response,
            sent_at=sent_at,
            on_lost=on_lost,
            safety_margin=safety_margin,
            renewer=self._renewer,
        )
        return won or ClaimRefused.from_proto(response)

    def _send_claim(
        self,
        method: grpc.UnaryUnaryMultiCallable[Any, worker_pb2.ClaimResponse],
        request: AnyClaim,
        timeout: float | None,
        abort: Abort | None = None,
    ) -> tuple[worker_pb2.ClaimResponse, float]:
        """A claim sent as one call under a key of its own (``claim_key``: a re-pinned request
        is another call): its answer, and when its lease clock starts (``lease_clock_start``)."""
        sent_at, tries, key = time.monotonic(), Tries(), claim_key()
        response = self._rpc.call(
            method,
            request,
            hint=CLAIM_HINT,
            timeout=timeout,
            idempotency_key=key,
            tries=tries,
            abort=abort,
        )
        return response, lease_clock_start(sent_at, time.monotonic(), timeout, tries=tries.count)

    # --- managed jobs (sdk/managed.py) -------------------------------------------------------

    def list_jobs(self, worker_id: str = "") -> list[ListedJob]:
        """A worker's managed job records (this principal's when empty), each with whether its
        attempt still holds the claim."""
        return list_jobs(self._rpc, worker_id)

    def rediscover(
        self, worker_id: str = "", *, grace: Duration = DEFAULT_GRACE
    ) -> list[Rediscovered]:
        """After a restart: re-attach this worker's running jobs of current attempts, kill those
        of superseded attempts (pid and start time checked), record the ones that ended."""
        return rediscover(self._rpc, worker_id, grace=grace)

    def kill_orphans(self, worker_id: str = "", *, grace: Duration = DEFAULT_GRACE) -> int:
        """Kill this worker's jobs on this host whose attempts were superseded, and only
        those (``rediscover`` also re-attaches, and records the ended ones); how many."""
        return len(kill_orphans(self._rpc, worker_id, grace=grace))

    def resume(
        self, record: JobRecord, *, ttl: Duration, on_lost: LostCallback | None = None
    ) -> Claim:
        """A Claim for the still-current attempt of a re-attached job (``rediscover``), to renew
        its claim and commit after a restart; ``bind`` it to the job's handle."""
        return resume_claim(
            self._rpc,
            record,
            self.get_task(record.task_id),
            ttl=ttl,
            on_lost=on_lost,
            renewer=self._renewer,
        )

    def get_effect(self, effect_id: str) -> EffectInfo:
        """One effect record. Raises NotFound for an unknown id."""
        request = worker_pb2.GetEffectRequest(effect_id=effect_id)
        return EffectInfo.from_proto(self._rpc.call(self._rpc.worker.GetEffect, request).effect)

    def resolve_effect(
        self,
        effect_id: str,
        resolution: EffectState,
        *,
        external_ref: str = "",
        etag: str = "",
        reason: str = "",
    ) -> EffectInfo:
        """As the owner of the effect's open reconciliation (or an admin), say what the
        downstream did (COMMITTED or ABSENT) while no claim is alive; see ResolveEffect."""
        request = worker_pb2.ResolveEffectRequest(
            effect_id=effect_id,
            resolution=types_pb2.EffectState.ValueType(int(resolution)),
            external_ref=external_ref,
            etag=etag,
            reason=reason,
        )
        response = self._rpc.call(self._rpc.worker.ResolveEffect, request)
        return EffectInfo.from_proto(response.effect)

    # --- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the keepalive loop and close the channel. Claims of this client still held stop
        renewing and will be lost. Managed jobs whose claims ended are killed and recorded
        first."""
        settle(self._rpc)
        self._renewer.close()
        self._rpc.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WorkerClient({self._rpc.target!r}, principal={self.principal!r})"
