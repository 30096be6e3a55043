"""WorkerService: claim, and the acceptance points of a held claim.

Each method validates the whole request, takes the owner from the caller's identity (never from
a request field), calls one store operation and maps its verdict to the response. The contract
lives in protos/coordinator/v1/worker.proto; the rules live in the domain and the store.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass

import grpc

from coordinator.domain.decisions import Fence, Verdict
from coordinator.domain.roles import Role
from coordinator.domain.validation import non_negative, task_id
from coordinator.errors import CoordinatorError, InvalidArgument, PermissionDenied
from coordinator.logging import bound, note
from coordinator.server.identity import identity_of, principal_of
from coordinator.server.interceptors.stream_interceptor import CallerOf
from coordinator.server.renew_budget import RENEW_RATE, RenewBudgets
from coordinator.server.status import rpc
from coordinator.server.wire import common_wire, effect_wire, job_wire, task_wire, worker_wire
from coordinator.store import Caller, ClaimResult, Renewal, RenewAnswer, Store
from coordinator.v1 import worker_pb2, worker_pb2_grpc


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    """The worker-side calls, each a thin translation onto ``store.claims``/``store.acceptance``.

    Method names are the proto's (hence ``noqa: N802``): grpc dispatches by them.
    """

    def __init__(
        self, store: Store, *, max_claim_wait: float = 20.0, renew_rate: float = RENEW_RATE
    ) -> None:
        self._store = store
        self._max_claim_wait = max_claim_wait
        self._renew_budgets = RenewBudgets(renew_rate, store.ctx.metrics, time.monotonic)

    @rpc
    def Claim(  # noqa: N802
        self, request: worker_pb2.ClaimRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ClaimResponse:
        """Claim one task by id."""
        tid = task_id(request.task_id)
        expected = non_negative("expected_state_version", request.expected_state_version)
        epoch = common_wire.parse_epoch("scheduler_epoch", request.scheduler_epoch)
        ttl = worker_wire.parse_ttl("ttl_seconds", request.ttl_seconds)
        principal = principal_of(context)
        with bound(task_id=tid, epoch=epoch, principal=principal):
            result = self._store.claims.claim(
                tid, principal=principal, epoch=epoch, ttl=ttl, expected_state_version=expected
            )
            _note_claim(result)
            # A caller gone by now would never hear of the claim: given back, not answered.
            self._store.give_backs.deliver([result], CallerOf(context), by=principal)
        return worker_wire.claim_to_proto(result)

    @rpc
    def ClaimNext(  # noqa: N802
        self, request: worker_pb2.ClaimNextRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ClaimResponse:
        """Claim the next ready task of a queue, waiting up to wait_seconds for one."""
        next_claim = _parse_next(request, "", self._max_claim_wait)
        principal = principal_of(context)
        return self._claim_batch(next_claim, principal, CallerOf(context))

    def _claim_batch(
        self, next_claim: _NextClaim, principal: str, caller: Caller
    ) -> worker_pb2.ClaimResponse:
        queue, epoch = next_claim.queue, next_claim.epoch
        with bound(queue=queue, epoch=epoch, principal=principal):
            results = self._store.long_poll.claim_batch(
                queue,
                principal=principal,
                epoch=epoch,
                ttl=next_claim.ttl,
                wait=next_claim.wait,
                caller=caller,
                max_tasks=next_claim.max_tasks,
            )
            _note_claim(results[0])
            if len(results) > 1:
                note(claimed=len(results))
        return worker_wire.batch_to_proto(results)

    @rpc
    def Renew(  # noqa: N802
        self, request: worker_pb2.RenewRequest, context: grpc.ServicerContext
    ) -> worker_pb2.RenewResponse:
        """Keep the claim's lease alive, within the server's bounds."""
        principal = principal_of(context)
        self._renew_budgets.take(principal, 1)
        renewal = worker_wire.parse_renewal(request)
        with _bound(renewal.fence, principal):
            result = self._store.renewals.renew(
                renewal.fence,
                principal=principal,
                progress=renewal.progress,
                checkpoint=renewal.checkpoint,
            )
            _note_verdict(result.verdict, ttl=result.ttl)
        return worker_wire.renew_to_proto(result)

    @rpc
    def RenewMany(  # noqa: N802
        self, request: worker_pb2.RenewManyRequest, context: grpc.ServicerContext
    ) -> worker_pb2.RenewManyResponse:
        """Renew many claims of the caller, each exactly as Renew would."""
        principal = principal_of(context)
        self._renew_budgets.take(principal, len(request.renewals))  # before the parse: its cost
        parsed = worker_wire.parse_renewals(request)
        renewals = [item for item in parsed if isinstance(item, Renewal)]
        with bound(principal=principal, renewals=len(parsed)):
            answers = iter(self._store.renewals.renew_many(renewals, principal=principal))
            results = [item if not isinstance(item, Renewal) else next(answers) for item in parsed]
            note(refused=sum(1 for r in results if not _renewed_ok(r)))
        return worker_wire.renew_many_to_proto(results)

    @rpc
    def AuthorizeTool(  # noqa: N802
        self, request: worker_pb2.AuthorizeToolRequest, context: grpc.ServicerContext
    ) -> worker_pb2.AuthorizeToolResponse:
        """Ask, before a side effect, whether the fence still holds."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        tool = common_wire.parse_text("tool", request.tool)
        action = common_wire.parse_text("action", request.action)
        principal = principal_of(context)
        with _bound(fence, principal):
            verdict = self._store.acceptance.authorize_tool(
                fence, principal=principal, tool=tool, action=action
            )
            # The call's line is the audit record of the tool call (the store keeps none).
            _note_verdict(verdict, tool=tool, action=action)
        return worker_wire.authorize_to_proto(verdict)

    @rpc
    def StageResult(  # noqa: N802
        self, request: worker_pb2.StageResultRequest, context: grpc.ServicerContext
    ) -> worker_pb2.StageResultResponse:
        """Stage a result in the attempt's own area."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        digest = worker_wire.parse_result_payload(
            request.result, request.result_digest, request.result_ref
        )
        principal = principal_of(context)
        with _bound(fence, principal):
            staged = self._store.acceptance.stage_result(
                fence,
                principal=principal,
                result_digest=digest,
                result=request.result,
                result_ref=request.result_ref,
            )
            _note_verdict(staged.verdict, current=staged.current, digest=digest)
        return worker_wire.stage_to_proto(staged)

    @rpc
    def Commit(  # noqa: N802
        self, request: worker_pb2.CommitRequest, context: grpc.ServicerContext
    ) -> worker_pb2.CommitResponse:
        """Make the result canonical, behind the fence."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        input_digest = common_wire.parse_digest("input_digest", request.input_digest)
        digest = worker_wire.parse_result_payload(
            request.result, request.result_digest, request.result_ref
        )
        evidence = job_wire.parse_evidence(list(request.evidence))
        next_claim = None
        if request.HasField("next"):
            if request.next.wait_seconds:
                raise InvalidArgument(
                    "next.wait_seconds must be 0: a commit never waits for its next task "
                    "(long-poll with ClaimNext once the queue runs dry)"
                )
            next_claim = _parse_next(request.next, "next.", 0.0)
        principal = principal_of(context)
        with _bound(fence, principal):
            result = self._store.acceptance.commit(
                fence,
                principal=principal,
                input_digest=input_digest,
                result_digest=digest,
                result=request.result,
                result_ref=request.result_ref,
                evidence=evidence,
            )
            _note_verdict(result.verdict, commit_id=result.result_commit_id, digest=digest)
        response = worker_wire.commit_to_proto(result)
        if next_claim is not None:
            response.next.CopyFrom(self._claim_batch(next_claim, principal, CallerOf(context)))
        return response

    @rpc
    def Release(  # noqa: N802
        self, request: worker_pb2.ReleaseRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ReleaseResponse:
        """Give the task back."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        reason = common_wire.parse_text("reason", request.reason)
        principal = principal_of(context)
        with _bound(fence, principal):
            verdict = self._store.acceptance.release(fence, principal=principal, reason=reason)
            _note_verdict(verdict, release_reason=reason)
        return worker_wire.release_to_proto(verdict)

    @rpc
    def Fail(  # noqa: N802
        self, request: worker_pb2.FailRequest, context: grpc.ServicerContext
    ) -> worker_pb2.FailResponse:
        """Report the held attempt failed; the task goes to the retry decision."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        report = worker_wire.parse_failure_report(request)
        principal = principal_of(context)
        with _bound(fence, principal):
            result = self._store.failures.fail(fence, principal=principal, report=report)
            _note_verdict(
                result.verdict,
                error_code=report.code,
                retryable=report.retryable,
                state=result.state.name if result.state else None,
            )
        return worker_wire.fail_to_proto(result)

    @rpc
    def PrepareEffect(  # noqa: N802
        self, request: worker_pb2.PrepareEffectRequest, context: grpc.ServicerContext
    ) -> worker_pb2.PrepareEffectResponse:
        """Bind or look up a side-effect slot, behind the fence, and say what to do."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        node = effect_wire.parse_node_id(request.node_id)
        slot = effect_wire.parse_effect_slot(request.effect_slot)
        digest = effect_wire.parse_payload_digest(request.payload_digest)
        principal = principal_of(context)
        with _bound(fence, principal):
            result = self._store.effects.prepare(
                fence, principal=principal, node_id=node, effect_slot=slot, payload_digest=digest
            )
            effect = result.effect
            _note_verdict(
                result.verdict,
                action=result.action.name,
                effect_id=effect.effect_id if effect else None,
                effect_state=effect.state.name if effect else None,
                node_id=node,
                effect_slot=slot,
            )
        return effect_wire.prepare_to_proto(result)

    @rpc
    def RecordEffect(  # noqa: N802
        self, request: worker_pb2.RecordEffectRequest, context: grpc.ServicerContext
    ) -> worker_pb2.RecordEffectResponse:
        """Record what the downstream did for an effect, behind the fence."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        eid = effect_wire.parse_effect_id(request.effect_id)
        state = effect_wire.parse_recorded_state(request.state)
        ref = effect_wire.parse_external_ref(request.external_ref)
        etag = effect_wire.parse_etag(request.etag)
        owner = effect_wire.parse_reconcile_principal(request.reconcile_principal, state)
        principal = principal_of(context)
        with _bound(fence, principal):
            result = self._store.effects.record(
                fence,
                principal=principal,
                effect_id=eid,
                state=state,
                external_ref=ref,
                etag=etag,
                reconcile_principal=owner,
            )
            _note_verdict(result.verdict, effect_id=eid, effect_state=state.name)
        return effect_wire.record_to_proto(result)

    @rpc
    def GetEffect(  # noqa: N802
        self, request: worker_pb2.GetEffectRequest, context: grpc.ServicerContext
    ) -> worker_pb2.GetEffectResponse:
        """One effect record (no fence: reading changes nothing)."""
        eid = effect_wire.parse_effect_id(request.effect_id)
        effect = self._store.effects.get(eid)
        return worker_pb2.GetEffectResponse(effect=effect_wire.effect_to_proto(effect))

    @rpc
    def ResolveEffect(  # noqa: N802
        self, request: worker_pb2.ResolveEffectRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ResolveEffectResponse:
        """The reconcile owner or an admin resolves an uncertain effect without a claim."""
        eid = effect_wire.parse_effect_id(request.effect_id)
        resolution = effect_wire.parse_resolution(request.resolution)
        ref = effect_wire.parse_external_ref(request.external_ref)
        etag = effect_wire.parse_etag(request.etag)
        reason = common_wire.parse_text("reason", request.reason)
        caller = identity_of(context)
        effect = self._store.reconcile.resolve(
            eid,
            caller=caller.principal,
            is_admin=Role.ADMIN in caller.roles,
            resolution=resolution,
            external_ref=ref,
            etag=etag,
            reason=reason,
        )
        return worker_pb2.ResolveEffectResponse(effect=effect_wire.effect_to_proto(effect))

    @rpc
    def ListOpenEffects(  # noqa: N802
        self, request: worker_pb2.ListOpenEffectsRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ListOpenEffectsResponse:
        """One page of uncertain effects (read-only)."""
        tid = task_id(request.task_id) if request.task_id else ""
        rpc = "ListOpenEffects"
        effects, position = self._store.effects.list_open(
            task_id=tid,
            page_size=common_wire.parse_page_size(request.page_size),
            page_token=effect_wire.parse_effects_page_token(request.page_token, tid, rpc),
        )
        return worker_pb2.ListOpenEffectsResponse(
            effects=[effect_wire.effect_to_proto(e) for e in effects],
            next_page_token=effect_wire.effects_page_token(position, tid, rpc),
        )

    @rpc
    def ListEffects(  # noqa: N802
        self, request: worker_pb2.ListEffectsRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ListEffectsResponse:
        """One page of effects in every state, from the per-task effect index (read-only)."""
        tid = task_id(request.task_id) if request.task_id else ""
        rpc = "ListEffects"
        token = effect_wire.parse_effects_page_token(request.page_token, tid, rpc)
        effects, position = self._store.effects.list_all(
            task_id=tid, page_size=common_wire.parse_page_size(request.page_size), page_token=token
        )
        return worker_pb2.ListEffectsResponse(
            effects=[effect_wire.effect_to_proto(e) for e in effects],
            next_page_token=effect_wire.effects_page_token(position, tid, rpc),
        )

    @rpc
    def StartJob(  # noqa: N802
        self, request: worker_pb2.StartJobRequest, context: grpc.ServicerContext
    ) -> worker_pb2.StartJobResponse:
        """Record a managed job of the caller's attempt, behind the fence."""
        fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
        spec = job_wire.parse_start_spec(request)
        principal = principal_of(context)
        with _bound(fence, principal):
            result = self._store.jobs.start(fence, principal=principal, spec=spec)
            _note_verdict(result.verdict, job_id=spec.job_id, pid=spec.pid)
        return job_wire.start_to_proto(result)

    @rpc
    def FinishJob(  # noqa: N802
        self, request: worker_pb2.FinishJobRequest, context: grpc.ServicerContext
    ) -> worker_pb2.FinishJobResponse:
        """Record how a job ended (no fence: it is evidence), once."""
        tid, jid = job_wire.parse_task_and_job(request.task_id, request.job_id)
        state = job_wire.parse_finish_state(request.state)
        detail = job_wire.parse_detail(request.detail)
        principal = principal_of(context)
        with bound(task_id=tid, principal=principal):
            result = self._store.jobs.finish(
                tid,
                jid,
                principal=principal,
                state=state,
                exit_code=request.exit_code,
                detail=detail,
            )
            note(
                job_id=jid,
                job_state=result.job.state.name,
                exit_code=result.job.exit_code,
                recorded=result.recorded,
            )
        return job_wire.finish_to_proto(result)

    @rpc
    def ListJobs(  # noqa: N802
        self, request: worker_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ListJobsResponse:
        """A worker's jobs, each with whether its attempt still holds the claim."""
        wanted = job_wire.parse_worker_id(request.worker_id)
        identity = identity_of(context)
        worker = wanted or identity.principal
        if worker != identity.principal and not identity.may(frozenset({Role.ADMIN})):
            raise PermissionDenied(
                f"{identity.principal!r} may list only its own jobs, not those of {worker!r}"
            )
        return job_wire.jobs_to_proto(self._store.jobs.list_jobs(worker))


def _bound(fence: Fence, principal: str) -> AbstractContextManager[None]:
    """Bind the fence's task_id, attempt, generation and epoch to the call's log lines."""
    return bound(**_fence_fields(fence), principal=principal)


def _fence_fields(fence: Fence) -> dict[str, object]:
    return {
        "task_id": fence.task_id,
        "attempt": fence.attempt_id,
        "generation": fence.claim_generation,
        "epoch": fence.scheduler_epoch,
    }


def _note_verdict(verdict: Verdict, **extra: object) -> None:
    """The call's line says whether the acceptance point accepted, with outcome and reason."""
    note(
        accepted=verdict.accepted,
        outcome=verdict.outcome.name,
        reason=verdict.reason.name,
        detail=verdict.message or None,
        **extra,
    )


def _note_claim(result: ClaimResult) -> None:
    fence = result.fence
    if fence is None:
        _note_verdict(result.verdict)
        return
    # The winner's fence exists only now: the call's line carries all four fields.
    note(**_fence_fields(fence))
    _note_verdict(result.verdict, ttl=result.ttl)


def _renewed_ok(answer: RenewAnswer) -> bool:
    return not isinstance(answer, CoordinatorError) and answer.verdict.accepted


@dataclass(frozen=True)
class _NextClaim:
    """A ClaimNext's request, parsed: from ClaimNext itself or from a Commit's ``next``."""

    queue: str
    epoch: int
    ttl: int
    wait: float
    max_tasks: int


def _parse_next(request: worker_pb2.ClaimNextRequest, field: str, max_wait: float) -> _NextClaim:
    """Every field checked (``field`` prefixes the names in errors)."""
    try:
        return _NextClaim(
            queue=task_wire.parse_queue_or_default(request.queue),
            epoch=common_wire.parse_epoch("scheduler_epoch", request.scheduler_epoch),
            ttl=worker_wire.parse_ttl("ttl_seconds", request.ttl_seconds),
            wait=worker_wire.parse_wait_seconds(request.wait_seconds, max_wait),
            max_tasks=worker_wire.parse_max_tasks("max_tasks", request.max_tasks),
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"{field}{exc}") from None
