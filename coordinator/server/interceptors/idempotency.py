"""Idempotency keys for every mutating RPC, as one server interceptor.

A caller sends ``idempotency-key: <key>`` in the metadata of any mutating call. The interceptor
digests the method and the request (deterministic protobuf bytes), reserves
``{p}/idem/{principal}/{key}`` and runs the handler; a retry of the same request gets the stored
response bytes without running the handler again; the key reused for another request is
ALREADY_EXISTS; a duplicate that arrives while the first still runs waits briefly, then gets
ABORTED. Business outcomes (FENCED, ALREADY_CLAIMED, ...) are responses and are stored like any
response; errors are not stored: the key is freed so a corrected retry can run.

The answer of Claim, which hands out a claim, is kept only as long as the longest lease
(store/control/idempotency.py says why): the SDK keys every such call, so a retry whose first
try's answer was lost gets the same attempt instead of starting another.

The other calls that hand out claims key themselves: ClaimNext, the call the SDK sends most,
and Commit with ``next`` (what a multi-slot worker sends for every task). Their claim txns
write their key (store/claims/claim_keys.py), so the interceptor passes them through (ClaimNext
unwrapped, a Commit once it sees ``next``) and ``call_key`` reads the key for the service; a
retried Commit runs again, which a commit is safe to do (the same attempt and digest answer
COMMITTED again, "already committed by this attempt", writing nothing).

Which methods mutate is decided here, once: every unary method of the coordinator's services
is mutating unless ``READ_ONLY`` lists it, so an RPC added later gets keys without an edit.
Calls without the metadata key pass straight through. The interceptor must run after the auth
interceptor (it keys by the authenticated principal).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import structlog

from coordinator.domain.digests import digest_of
from coordinator.domain.idempotency import (
    IDEMPOTENCY_METADATA_KEY,
    idempotency_key,
    request_digest,
)
from coordinator.domain.space import WriteKind
from coordinator.errors import CoordinatorError
from coordinator.logging import note
from coordinator.server.identity import identity_of, principal_of
from coordinator.server.interceptors.handlers import metadata_value, unary_handler
from coordinator.server.interceptors.write_budgets import ADDS_DATA, WriteBudgets, growth_bytes
from coordinator.server.status import status_code_of
from coordinator.store.control.idempotency import IdempotencyStore, RequestInFlight, Reservation
from coordinator.v1 import types_pb2, worker_pb2

log = structlog.get_logger(__name__)

SERVICES = (
    "/coordinator.v1.WorkerService/",
    "/coordinator.v1.TaskService/",
    "/coordinator.v1.AdminService/",
)
"""Method-path prefixes whose unary methods take idempotency keys."""

READ_ONLY = frozenset(
    {
        "/coordinator.v1.TaskService/GetTask",
        "/coordinator.v1.TaskService/GetResult",
        "/coordinator.v1.TaskService/ListAttempts",
        "/coordinator.v1.TaskService/ListTasks",
        "/coordinator.v1.TaskService/WatchEvents",
        "/coordinator.v1.TaskService/ListEvents",
        "/coordinator.v1.TaskService/ListClaims",
        "/coordinator.v1.TaskService/ListDependencies",
        "/coordinator.v1.AdminService/GetEpoch",
        "/coordinator.v1.AdminService/DrainStatus",
        "/coordinator.v1.AdminService/GetStats",
        "/coordinator.v1.AdminService/GetVersions",
        "/coordinator.v1.WorkerService/GetEffect",
        "/coordinator.v1.WorkerService/ListJobs",
        "/coordinator.v1.WorkerService/ListOpenEffects",
        "/coordinator.v1.WorkerService/ListEffects",
    }
)
"""The methods that change nothing: a key sent with them is ignored."""

GROWTH_METHODS = ADDS_DATA
"""The keyed methods that only add data (the write budgets' ``ADDS_DATA``): their new key is
growth too, refused by the space guard above etcd's high-water mark before the call runs. A key
on any other call (a commit, a release) is part of draining the pool and goes on."""


CLAIM = "/coordinator.v1.WorkerService/Claim"
CLAIM_NEXT = "/coordinator.v1.WorkerService/ClaimNext"
COMMIT = "/coordinator.v1.WorkerService/Commit"


def is_mutating(method: str) -> bool:
    """Whether ``method`` (a full gRPC path) takes idempotency keys."""
    return method.startswith(SERVICES) and method not in READ_ONLY


class IdempotencyInterceptor:
    """Replays stored responses of keyed mutating calls (see the module docstring)."""

    def __init__(
        self,
        store: IdempotencyStore,
        budgets: WriteBudgets,
        input_of: Callable[[str], bytes],
    ) -> None:
        self._store = store
        self._budgets = budgets
        self._input_of = input_of

    def build(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """Wrap unary mutating handlers (a call that carries a key is replayed or stored)."""
        if handler.unary_unary is None or not is_mutating(method) or method == CLAIM_NEXT:
            return handler
        # The behaviour below returns serialized bytes: a replay has no message object.
        return unary_handler(handler, self._keyed(method, handler), response_serializer=_as_bytes)

    def _keyed(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> Callable[[Any, grpc.ServicerContext], bytes]:
        store = self._store
        run = handler.unary_unary
        assert run is not None  # build wraps unary-unary handlers only
        serialize = handler.response_serializer or (lambda m: m.SerializeToString())

        may_claim_next = method == COMMIT  # a Commit with next keys itself
        claims = method == CLAIM  # its answer lives only as long as a lease

        def behavior(request: Any, context: grpc.ServicerContext) -> bytes:
            raw_key = metadata_value(context.invocation_metadata(), IDEMPOTENCY_METADATA_KEY)
            if raw_key is None or (may_claim_next and request.HasField("next")):
                answer: bytes = serialize(run(request, context))
                return answer
            try:
                key = idempotency_key(raw_key)
                principal = principal_of(context)
                digest = request_digest(method, request.SerializeToString(deterministic=True))
                kind = WriteKind.GROWTH if method in GROWTH_METHODS else WriteKind.DRAIN
                reserved = store.reserve(
                    principal, key, method=method, digest=digest, kind=kind, claims=claims
                )
            except RequestInFlight as exc:
                _abort(context, grpc.StatusCode.ABORTED, str(exc))
            except CoordinatorError as exc:
                _abort(context, status_code_of(exc), str(exc))
            if isinstance(reserved, bytes):
                note(idempotent_replay=True, idempotency_key=key)
                return with_input(reserved, self._input_of) if claims else reserved
            stored = _Stored(method, request, context, claims)
            return self._run(reserved, run, serialize, stored)

        return behavior

    def _run(
        self,
        reserved: Reservation,
        run: Callable[[Any, grpc.ServicerContext], Any],
        serialize: Callable[[Any], bytes],
        call: _Stored,
    ) -> bytes:
        try:
            response = serialize(run(call.request, call.context))
        except BaseException:
            # An error (context.abort raises) is not a response: free the key for a retry.
            self._forget(reserved)
            raise
        try:
            # What storing the answer adds beyond what the request was charged (a cancel's
            # answer carries the task's input): the caller's, like any byte it writes. Not a
            # claim's: the SDK keys every one, its answer carries the task's input and lives
            # only as long as a lease (a worker would pay each input it is handed).
            if not call.claims:
                added = call.added(response)
                self._budgets.charge(identity_of(call.context), "stored_answer", added)
            kept = without_input(response) if call.claims else response
            if not self._store.complete(reserved, kept, claims=call.claims):
                log.warning(
                    "idempotency reservation lost before its response was stored", key=reserved.key
                )
        except CoordinatorError as exc:
            # The call itself succeeded; failing it now would invite a second execution. The
            # key is freed, or a retry would meet it PENDING and get ABORTED until its lease
            # ends: an answer etcd refuses to store (a claim batch's inputs past its request
            # size) is then answered as an unkeyed call would be, by running again.
            log.warning("idempotent response not stored", key=reserved.key, error=str(exc))
            self._forget(reserved)
        return response

    def _forget(self, reserved: Reservation) -> None:
        try:
            self._store.abandon(reserved)
        except CoordinatorError as exc:  # the short pending lease frees it anyway
            log.warning("idempotency reservation not freed", key=reserved.key, error=str(exc))


@dataclass(frozen=True)
class _Stored:
    """A keyed call whose answer is to be stored."""

    method: str
    request: Any
    context: grpc.ServicerContext
    claims: bool

    def added(self, response: bytes) -> int:
        """The bytes storing ``response`` adds beyond what the request was charged for."""
        charged = growth_bytes(self.method, self.request) if self.method in ADDS_DATA else 0
        return len(response) - charged


def without_input(response: bytes) -> bytes:
    """A Claim's answer as it is kept for a replay: without the task's input (up to 256 KiB),
    which a replay reads back (``with_input``). Kept whole, one worker minting a key per claim
    of four tasks with large inputs stored 244 MiB of answers in 15 s, uncharged."""
    answer = worker_pb2.ClaimResponse.FromString(response)
    if not answer.input:
        return response
    answer.ClearField("input")
    return answer.SerializeToString()


def with_input(kept: bytes, input_of: Callable[[str], bytes]) -> bytes:
    """A kept Claim answer as the first try's was: the task's input read back, if it is still
    the input the claim handed out (its digest); else as kept, without it."""
    answer = worker_pb2.ClaimResponse.FromString(kept)
    if answer.outcome != types_pb2.OUTCOME_CLAIMED or not answer.input_digest:
        return kept
    try:
        data = input_of(answer.fence.task_id)
    except CoordinatorError:  # the task is gone: the claim with it
        return kept
    if digest_of(data) != answer.input_digest:
        return kept
    answer.input = data
    return answer.SerializeToString()


def call_key(context: grpc.ServicerContext, method: str, request: Any) -> tuple[str, str] | None:
    """The idempotency key of a call that keys itself (ClaimNext, Commit with ``next``) and the
    digest of its request, or None for an unkeyed call. InvalidArgument for a malformed key."""
    raw_key = metadata_value(context.invocation_metadata(), IDEMPOTENCY_METADATA_KEY)
    if raw_key is None:
        return None
    digest = request_digest(method, request.SerializeToString(deterministic=True))
    return idempotency_key(raw_key), digest


def _as_bytes(data: bytes) -> bytes:
    return data


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    # The call's line (coordinator.server.interceptors.call_log) records the refusal.
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # grpc's abort always raises
