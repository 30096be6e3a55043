"""Per-principal write budgets at the door: the bytes a call adds to etcd are charged to its
caller before the handler runs (domain/write_budget.py holds the rule).

CreateTask and UpdateInput (the whole request and the keys it writes: a create with no input
is not free), StageResult (the result), Commit (its inline result and evidence), StartJob (the
job record), PrepareEffect (the slot), and RecordEffect and ResolveEffect (the slot written
again with the downstream's reference) past the budget are refused ``RESOURCE_EXHAUSTED``
naming the budget and when to retry; nothing runs, so nothing is written. A renewal's
checkpoint past the budget is taken out of the request instead and the renewal runs without
it: refusing the renewal would cost the claim (the SDK treats a refused item as lost), so the
answer's ``checkpoint_refused`` says the checkpoint was not kept. A failure past it lands
without its details, its message cut.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

import grpc
import orjson

from coordinator.domain.failures import KEPT_MESSAGE
from coordinator.domain.roles import Identity, Role
from coordinator.domain.write_budget import (
    Bucket,
    BudgetPolicy,
    Refused,
    policy_for,
    refund,
    refusal_message,
    spend,
)
from coordinator.errors import ResourceExhausted
from coordinator.metrics import Metrics
from coordinator.server.identity import identity_of
from coordinator.server.interceptors.handlers import Handler, unary_handler
from coordinator.v1 import types_pb2

PRINCIPALS = 65536
"""Principals whose buckets a replica remembers; the least recently seen is forgotten first
(it starts again with a full bucket: tokens, hence principals, are an operator's to hand out)."""

KEY_BYTES = 512
"""What one key a call writes is charged beyond the bytes the request carries: a small record
with its key under a long prefix (a create with no input writes six keys, 1.4-1.6 KB), so a
call that carries nothing is not free."""
COPIES = 4
"""How many times a create or an input change is charged the request's bytes other than the
input: the record, the dependency edges and the dependents' index keys (whose names hold two
task ids) each carry them again. ``tests/server/test_write_charges.py`` holds what each call
writes to be at most what it is charged."""


def _changed_bytes(request: Any, keys: int) -> int:
    """A create's or an input change's charge: the input once, the rest COPIES times, and
    KEY_BYTES for each key it writes."""
    data = len(getattr(request, "input", b""))
    return int(data + COPIES * (request.ByteSize() - data) + KEY_BYTES * keys)


def _base64(nbytes: int) -> int:
    """The length of ``nbytes`` of payload as a record stores them (base64)."""
    return 4 * ((nbytes + 2) // 3)


def _text_bytes(request: Any, field: str) -> int:
    """A text field as the stored record spells it (a control character takes six bytes)."""
    return len(orjson.dumps(getattr(request, field)))


def _commit_bytes(request: Any) -> int:
    """A commit's charge: what its canonical result record holds beyond a commit with no
    result, which is free (its inline result, its reference and its evidence: up to 64
    references of 2,048 characters)."""
    texts = [request.result_ref, *request.evidence]
    payload = _base64(len(request.result)) + sum(len(orjson.dumps(t)) + 1 for t in texts if t)
    # The record's ids and revisions may be a few digits longer than a bare commit's.
    return payload + 64 if payload else 0


_MEASURED: dict[str, tuple[str, Callable[[Any], int]]] = {
    # A create writes six keys, and one more per upstream; an input change four at most.
    "/coordinator.v1.TaskService/CreateTask": (
        "input",
        lambda r: _changed_bytes(r, 6 + len(r.depends_on)),
    ),
    "/coordinator.v1.TaskService/UpdateInput": ("input", lambda r: _changed_bytes(r, 4)),
    # New edges replace the old: the record, an event and two keys per upstream (its edge and
    # the upstream's dependents' index). Uncharged, swapping fifty long upstreams back and
    # forth grew etcd 5.5 MiB/s.
    "/coordinator.v1.TaskService/SetDependencies": (
        "dependencies",
        lambda r: _changed_bytes(r, 2 + 2 * len(r.depends_on)),
    ),
    "/coordinator.v1.WorkerService/StageResult": (
        "staged_result",
        lambda r: _base64(len(r.result)) + 2 * KEY_BYTES,
    ),
}
EFFECT_REWRITE = 6 * KEY_BYTES
"""What recording or resolving an effect is charged beyond its text: the slot's record written
again with the reconciliation it opens or closes (about 2.1 KB at the longest ids)."""


def _effect_text_bytes(request: Any, *texts: str) -> int:
    """A RecordEffect's or ResolveEffect's charge: the slot's rewrite and its text as the
    stored record spells it (a control character takes six bytes there: a reference of 2,048
    of them and its etag came to 14 KB)."""
    return EFFECT_REWRITE + sum(_text_bytes(request, t) for t in texts)


_ALSO_CHARGED: dict[str, tuple[str, Callable[[Any], int]]] = {
    # A job record (argv up to 16 Ki characters), an effect slot (its record and the task's
    # index entry) and what an effect's record and resolution add to it (the downstream's
    # reference and etag, the reconcile owner, the reason): data too, but part of running a
    # claim, so not growth the space guard refuses above high water; only their caller's
    # budget bounds them.
    "/coordinator.v1.WorkerService/StartJob": ("job", lambda r: r.ByteSize()),
    # A commit's result: it finishes work, so the space guard lets it through above high
    # water (a pool must drain), but one token committing 512 KiB results filled etcd to
    # NOSPACE in seconds when nothing charged them. The claim -> commit cycle's own keys
    # (about 3.4 KB) stay free: they are what draining costs.
    "/coordinator.v1.WorkerService/Commit": ("result", _commit_bytes),
    "/coordinator.v1.WorkerService/PrepareEffect": (
        "effect",
        lambda r: COPIES * r.ByteSize() + 2 * KEY_BYTES,
    ),
    "/coordinator.v1.WorkerService/RecordEffect": (
        "effect",
        lambda r: _effect_text_bytes(r, "external_ref", "etag", "reconcile_principal"),
    ),
    "/coordinator.v1.WorkerService/ResolveEffect": (
        "effect",
        lambda r: _effect_text_bytes(r, "external_ref", "etag", "reason"),
    ),
}
_RENEW = "/coordinator.v1.WorkerService/Renew"
_RENEW_MANY = "/coordinator.v1.WorkerService/RenewMany"
_FAIL = "/coordinator.v1.WorkerService/Fail"
ADDS_DATA = frozenset(_MEASURED)
"""The methods whose request is data added to etcd (an input, a staged result)."""
CHARGED_METHODS = frozenset({*ADDS_DATA, _RENEW, _RENEW_MANY, _FAIL})
"""The methods whose requests can add data to etcd: ``ADDS_DATA``, the renewals, whose
checkpoints do, and a failure's details (the bytes ``growth_bytes`` measures)."""


def growth_bytes(method: str, request: Any) -> int:
    """The bytes a call of ``method`` (one of CHARGED_METHODS) asks to add: its input or staged
    result, the checkpoints its renewals carry, or a failure's report."""
    if method in _MEASURED:
        return _MEASURED[method][1](request)
    if method == _FAIL:
        return failure_bytes(request)
    items = [request] if method == _RENEW else request.renewals
    return sum(len(r.checkpoint) for r in items if r.HasField("checkpoint"))


def charged_bytes(method: str, request: Any) -> int:
    """What a call of a charged method (``_MEASURED``, ``_ALSO_CHARGED``, a failure, a renewal)
    takes from its caller's budget, at most."""
    if method in _ALSO_CHARGED:
        return _ALSO_CHARGED[method][1](request)
    return growth_bytes(method, request)


def failure_bytes(request: Any) -> int:
    """A failure's report is kept three times (the attempt, the task's last error, the event
    names its code and message) beside the four keys the move writes."""
    return 3 * (len(request.error_message) + len(request.error_details)) + 4 * KEY_BYTES


WROTE_NOTHING = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
"""The refusals of a call's input or its target's state, which write nothing: its charge is
given back (eight creates with a 3 MB task id spent a producer's budget, and its next calls
were told to retry later)."""


class BudgetExceeded(ResourceExhausted):
    """A call would write more than its caller's write budget allows now."""


class WriteBudgets:
    """Every principal's bucket on this replica, under per-role policies."""

    def __init__(
        self,
        policies: Mapping[Role, BudgetPolicy],
        *,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policies = dict(policies)
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, Bucket] = OrderedDict()

    @property
    def active(self) -> bool:
        """Whether any role has a budget (without one, nothing is wrapped)."""
        return any(not policy.unbounded for policy in self._policies.values())

    def charge(self, identity: Identity, what: str, nbytes: int) -> None:
        """Take ``nbytes`` of ``what`` from the caller's budget; BudgetExceeded if they do not
        fit (nothing taken)."""
        policy = policy_for(identity.roles, self._policies)
        if policy.unbounded or nbytes <= 0:
            return
        outcome = self._spend(identity.principal, policy, nbytes)
        if outcome is None:
            return
        self._metrics.write_budget_refusals.labels(what).inc()
        setting = self._setting_of(identity, policy)
        raise BudgetExceeded(refusal_message(identity.principal, setting, policy, nbytes, outcome))

    def refund(self, identity: Identity, nbytes: int) -> None:
        """Give back ``nbytes`` a call was charged and did not write."""
        policy = policy_for(identity.roles, self._policies)
        if policy.unbounded or nbytes <= 0:
            return
        with self._lock:
            bucket = self._buckets.get(identity.principal)
            if bucket is not None:  # a forgotten bucket is a full one already
                self._buckets[identity.principal] = refund(bucket, policy, nbytes, self._clock())

    def fits(self, identity: Identity, nbytes: int) -> bool:
        """Take ``nbytes`` from a caller's bounded budget if they fit (True); a caller without
        a budget, or past it, gets False and nothing is taken (nor counted: the caller decides
        what a miss means)."""
        policy = policy_for(identity.roles, self._policies)
        if policy.unbounded:
            return False
        return nbytes <= 0 or self._spend(identity.principal, policy, nbytes) is None

    def _spend(self, principal: str, policy: BudgetPolicy, nbytes: int) -> Refused | None:
        """Take ``nbytes`` from ``principal``'s bucket; the refusal if they do not fit."""
        with self._lock:
            outcome = spend(self._buckets.get(principal), policy, nbytes, self._clock())
            if isinstance(outcome, Refused):
                return outcome
            self._buckets[principal] = outcome.bucket
            self._buckets.move_to_end(principal)
            while len(self._buckets) > PRINCIPALS:
                self._buckets.popitem(last=False)
            return None

    def _setting_of(self, identity: Identity, policy: BudgetPolicy) -> str:
        role = next(r for r in sorted(identity.roles) if self._policies.get(r) == policy)
        return f"write_budget_{role.value}"


class WriteBudgetInterceptor:
    """Charges the growth calls' bytes before their handlers run (see the module docstring)."""

    def __init__(self, budgets: WriteBudgets) -> None:
        self._budgets = budgets

    def build(self, method: str, handler: Handler) -> Handler:
        """Wrap the measured unary methods, failures and renewals; others pass through."""
        if handler.unary_unary is None or not self._budgets.active:
            return handler
        if method in _MEASURED or method in _ALSO_CHARGED:
            return self._charged(method, handler)
        if method == _FAIL:
            return self._trimmed(handler)
        if method in (_RENEW, _RENEW_MANY):
            return self._stripped(method, handler)
        return handler

    def _charged(self, method: str, handler: Handler) -> Handler:
        """A call past its caller's budget is refused RESOURCE_EXHAUSTED; nothing runs."""
        run, budgets = handler.unary_unary, self._budgets
        assert run is not None
        what, measure = _MEASURED.get(method) or _ALSO_CHARGED[method]

        def charged(request: Any, context: grpc.ServicerContext) -> Any:
            identity, nbytes = identity_of(context), measure(request)
            try:
                budgets.charge(identity, what, nbytes)
            except BudgetExceeded as exc:
                _abort(context, str(exc))
            try:
                return run(request, context)
            except BaseException:
                # Refused before anything was written (the stubs lack ServicerContext.code()).
                if context.code() in WROTE_NOTHING:  # type: ignore[attr-defined]
                    budgets.refund(identity, nbytes)
                raise

        return unary_handler(handler, charged)

    def _trimmed(self, handler: Handler) -> Handler:
        """A failure past its caller's budget lands without its details (refused, it would
        only leave the lease to expire, which ends the attempt all the same)."""
        run, budgets = handler.unary_unary, self._budgets
        assert run is not None

        def failed(request: Any, context: grpc.ServicerContext) -> Any:
            try:
                budgets.charge(identity_of(context), "failure_details", failure_bytes(request))
            except BudgetExceeded:
                request.ClearField("error_details")
                request.error_message = request.error_message[:KEPT_MESSAGE]
            return run(request, context)

        return unary_handler(handler, failed)

    def _stripped(self, method: str, handler: Handler) -> Handler:
        """A renewal's checkpoint past its caller's budget is taken out; the renewal runs."""
        run = handler.unary_unary
        assert run is not None

        def renewed(request: Any, context: grpc.ServicerContext) -> Any:
            items = [request] if method == _RENEW else list(request.renewals)
            refused = self._strip(identity_of(context), items)
            response = run(request, context)
            answers = [response] if method == _RENEW else [r.renewal for r in response.results]
            for i, message in refused.items():
                if answers[i].outcome == types_pb2.OUTCOME_OK:
                    answers[i].checkpoint_refused = message
            return response

        return unary_handler(handler, renewed)

    def _strip(self, identity: Identity, renewals: list[Any]) -> dict[int, str]:
        """Charge each renewal's checkpoint; take out those past the budget. Their refusals,
        by index."""
        refused: dict[int, str] = {}
        for i, renewal in enumerate(renewals):
            if not renewal.HasField("checkpoint"):
                continue
            try:
                self._budgets.charge(identity, "checkpoint", len(renewal.checkpoint))
            except BudgetExceeded as exc:
                renewal.ClearField("checkpoint")
                refused[i] = str(exc)
        return refused


def _abort(context: grpc.ServicerContext, message: str) -> NoReturn:
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
    raise AssertionError("context.abort returned")  # grpc's abort always raises
