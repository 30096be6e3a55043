"""WorkerService: claim, and the acceptance points of a held claim.

Each method parses its whole request with its one ``parse_<rpc>`` (server/wire/worker_requests.py)
before anything else, takes the owner from the caller's identity (never from a request field),
calls one store operation and maps its verdict to the response. The contract
lives in protos/coordinator/v1/worker.proto; the rules live in the domain and the store.
"""

from __future__ import annotations

import time

import grpc

from coordinator.domain.decisions import Verdict
from coordinator.domain.idempotency import KeyReused
from coordinator.domain.roles import Role
from coordinator.domain.states import Outcome
from coordinator.errors import CoordinatorError, PermissionDenied
from coordinator.logging import bound, note
from coordinator.server.identity import identity_of, principal_of
from coordinator.server.interceptors.idempotency import CLAIM_NEXT, COMMIT, call_key
from coordinator.server.interceptors.stream_interceptor import CallerOf
from coordinator.server.renew_budget import RENEW_RATE, RenewBudgets
from coordinator.server.services.call_notes import (
    bound_fence,
    note_claim,
    note_verdict,
)
from coordinator.server.services.claim_batches import ClaimBatches
from coordinator.server.status import rpc
from coordinator.server.wire import effect_wire, job_wire, worker_wire
from coordinator.server.wire import worker_requests as requests
from coordinator.store import ClaimResult, Renewal, RenewAnswer, Store
from coordinator.v1 import worker_pb2, worker_pb2_grpc


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    """The worker-side calls, each a thin translation onto ``store.claims``/``store.acceptance``.

    Method names are the proto's (hence ``noqa: N802``): grpc dispatches by them.
    """

    def __init__(
        self, store: Store, *, max_claim_wait: float = 20.0, renew_rate: float = RENEW_RATE
    ) -> None:
        self._store = store
        self._batches = ClaimBatches(store)
        self._max_claim_wait = max_claim_wait
        self._renew_budgets = RenewBudgets(renew_rate, store.ctx.metrics, time.monotonic)

    @rpc
    def Claim(  # noqa: N802
        self, request: worker_pb2.ClaimRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ClaimResponse:
        """Claim one task by id."""
        args = requests.parse_claim(request)
        principal = principal_of(context)
        with bound(task_id=args.task_id, epoch=args.epoch, principal=principal):
            result = self._store.claims.claim(
                args.task_id,
                principal=principal,
                epoch=args.epoch,
                ttl=args.ttl,
                expected_state_version=args.expected_state_version,
            )
            note_claim(result)
            # A caller gone by now would never hear of the claim: given back, not answered.
            self._store.give_backs.deliver([result], CallerOf(context), by=principal)
        return worker_wire.claim_to_proto(result)

    @rpc
    def ClaimNext(  # noqa: N802
        self, request: worker_pb2.ClaimNextRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ClaimResponse:
        """Claim the next ready task of a queue, waiting up to wait_seconds for one. A keyed
        call writes its key in its claim txns (store/claims/claim_keys.py): a retry of one
        whose answer was lost gets the claims it won."""
        next_claim = requests.parse_claim_next(request, max_wait=self._max_claim_wait)
        principal = principal_of(context)
        keyed = call_key(context, CLAIM_NEXT, request)
        if keyed is None:
            return self._batches.claim(next_claim, principal, CallerOf(context))
        return self._batches.keyed(next_claim, principal, CallerOf(context), CLAIM_NEXT, keyed)

    @rpc
    def Renew(  # noqa: N802
        self, request: worker_pb2.RenewRequest, context: grpc.ServicerContext
    ) -> worker_pb2.RenewResponse:
        """Keep the claim's lease alive, within the server's bounds."""
        principal = principal_of(context)
        self._renew_budgets.take(principal, 1)
        renewal = requests.parse_renew(request)
        with bound_fence(renewal.fence, principal):
            result = self._store.renewals.renew(
                renewal.fence,
                principal=principal,
                progress=renewal.progress,
                checkpoint=renewal.checkpoint,
            )
            note_verdict(result.verdict, ttl=result.ttl)
        return worker_wire.renew_to_proto(result)

    @rpc
    def RenewMany(  # noqa: N802
        self, request: worker_pb2.RenewManyRequest, context: grpc.ServicerContext
    ) -> worker_pb2.RenewManyResponse:
        """Renew many claims of the caller, each exactly as Renew would."""
        principal = principal_of(context)
        self._renew_budgets.take(principal, len(request.renewals))  # before the parse: its cost
        parsed = requests.parse_renew_many(request)
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
        args = requests.parse_authorize_tool(request)
        principal = principal_of(context)
        with bound_fence(args.fence, principal):
            verdict = self._store.acceptance.authorize_tool(
                args.fence, principal=principal, tool=args.tool, action=args.action
            )
            # The call's line is the audit record of the tool call (the store keeps none).
            note_verdict(verdict, tool=args.tool, action=args.action)
        return worker_wire.authorize_to_proto(verdict)

    @rpc
    def StageResult(  # noqa: N802
        self, request: worker_pb2.StageResultRequest, context: grpc.ServicerContext
    ) -> worker_pb2.StageResultResponse:
        """Stage a result in the attempt's own area."""
        args = requests.parse_stage_result(request)
        principal = principal_of(context)
        with bound_fence(args.fence, principal):
            staged = self._store.acceptance.stage_result(
                args.fence,
                principal=principal,
                result_digest=args.result_digest,
                result=args.result,
                result_ref=args.result_ref,
            )
            note_verdict(staged.verdict, current=staged.current, digest=args.result_digest)
        return worker_wire.stage_to_proto(staged)

    @rpc
    def Commit(  # noqa: N802
        self, request: worker_pb2.CommitRequest, context: grpc.ServicerContext
    ) -> worker_pb2.CommitResponse:
        """Make the result canonical, behind the fence; with ``next``, claim in the same call.
        A keyed call with ``next`` keys its claims itself (``ClaimBatches.keyed``): its retry
        commits again, which answers as the first time without writing. Its key, met only after
        the commit, if used for another request refuses the next claim, not the commit."""
        args = requests.parse_commit(request)
        principal = principal_of(context)
        keyed = call_key(context, COMMIT, request) if args.next is not None else None
        with bound_fence(args.fence, principal):
            result = self._store.acceptance.commit(
                args.fence,
                principal=principal,
                input_digest=args.input_digest,
                result_digest=args.result_digest,
                result=args.result,
                result_ref=args.result_ref,
                evidence=args.evidence,
            )
            note_verdict(
                result.verdict, commit_id=result.result_commit_id, digest=args.result_digest
            )
        response = worker_wire.commit_to_proto(result)
        if args.next is None:
            return response
        caller = CallerOf(context)
        if keyed is None:
            response.next.CopyFrom(self._batches.claim(args.next, principal, caller))
            return response
        try:
            response.next.CopyFrom(self._batches.keyed(args.next, principal, caller, COMMIT, keyed))
        except KeyReused as exc:
            # The commit above landed (or was refused) on its own: answering ALREADY_EXISTS
            # now would hide it. The next claim, which claimed nothing, says why.
            refused = Verdict(Outcome.NOT_CLAIMABLE, message=f"{exc}; no next task was claimed")
            response.next.CopyFrom(worker_wire.claim_to_proto(ClaimResult(refused)))
        return response

    @rpc
    def Release(  # noqa: N802
        self, request: worker_pb2.ReleaseRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ReleaseResponse:
        """Give the task back."""
        args = requests.parse_release(request)
        principal = principal_of(context)
        with bound_fence(args.fence, principal):
            verdict = self._store.acceptance.release(
                args.fence, principal=principal, reason=args.reason
            )
            note_verdict(verdict, release_reason=args.reason)
        return worker_wire.release_to_proto(verdict)

    @rpc
    def Fail(  # noqa: N802
        self, request: worker_pb2.FailRequest, context: grpc.ServicerContext
    ) -> worker_pb2.FailResponse:
        """Report the held attempt failed; the task goes to the retry decision."""
        args = requests.parse_fail(request)
        fence, report = args.fence, args.report
        principal = principal_of(context)
        with bound_fence(fence, principal):
            result = self._store.failures.fail(fence, principal=principal, report=report)
            note_verdict(
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
        args = requests.parse_prepare_effect(request)
        fence, node, slot = args.fence, args.node_id, args.effect_slot
        digest = args.payload_digest
        principal = principal_of(context)
        with bound_fence(fence, principal):
            result = self._store.effects.prepare(
                fence, principal=principal, node_id=node, effect_slot=slot, payload_digest=digest
            )
            effect = result.effect
            note_verdict(
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
        args = requests.parse_record_effect(request)
        principal = principal_of(context)
        with bound_fence(args.fence, principal):
            result = self._store.effects.record(
                args.fence,
                principal=principal,
                effect_id=args.effect_id,
                state=args.state,
                external_ref=args.external_ref,
                etag=args.etag,
                reconcile_principal=args.reconcile_principal,
            )
            note_verdict(result.verdict, effect_id=args.effect_id, effect_state=args.state.name)
        return effect_wire.record_to_proto(result)

    @rpc
    def GetEffect(  # noqa: N802
        self, request: worker_pb2.GetEffectRequest, context: grpc.ServicerContext
    ) -> worker_pb2.GetEffectResponse:
        """One effect record (no fence: reading changes nothing)."""
        effect = self._store.effects.get(requests.parse_get_effect(request))
        return worker_pb2.GetEffectResponse(effect=effect_wire.effect_to_proto(effect))

    @rpc
    def ResolveEffect(  # noqa: N802
        self, request: worker_pb2.ResolveEffectRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ResolveEffectResponse:
        """The reconcile owner or an admin resolves an uncertain effect without a claim."""
        args = requests.parse_resolve_effect(request)
        caller = identity_of(context)
        effect = self._store.reconcile.resolve(
            args.effect_id,
            caller=caller.principal,
            is_admin=Role.ADMIN in caller.roles,
            resolution=args.resolution,
            external_ref=args.external_ref,
            etag=args.etag,
            reason=args.reason,
        )
        return worker_pb2.ResolveEffectResponse(effect=effect_wire.effect_to_proto(effect))

    @rpc
    def ListOpenEffects(  # noqa: N802
        self, request: worker_pb2.ListOpenEffectsRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ListOpenEffectsResponse:
        """One page of uncertain effects (read-only)."""
        page = requests.parse_list_open_effects(request)
        effects, position = self._store.effects.list_open(
            task_id=page.task_id, page_size=page.page_size, page_token=page.page_token
        )
        return worker_pb2.ListOpenEffectsResponse(
            effects=[effect_wire.effect_to_proto(e) for e in effects],
            next_page_token=effect_wire.effects_page_token(position, page.task_id, page.rpc),
        )

    @rpc
    def ListEffects(  # noqa: N802
        self, request: worker_pb2.ListEffectsRequest, context: grpc.ServicerContext
    ) -> worker_pb2.ListEffectsResponse:
        """One page of effects in every state, from the per-task effect index (read-only)."""
        page = requests.parse_list_effects(request)
        effects, position = self._store.effects.list_all(
            task_id=page.task_id, page_size=page.page_size, page_token=page.page_token
        )
        return worker_pb2.ListEffectsResponse(
            effects=[effect_wire.effect_to_proto(e) for e in effects],
            next_page_token=effect_wire.effects_page_token(position, page.task_id, page.rpc),
        )

    @rpc
    def StartJob(  # noqa: N802
        self, request: worker_pb2.StartJobRequest, context: grpc.ServicerContext
    ) -> worker_pb2.StartJobResponse:
        """Record a managed job of the caller's attempt, behind the fence."""
        args = requests.parse_start_job(request)
        principal = principal_of(context)
        with bound_fence(args.fence, principal):
            result = self._store.jobs.start(args.fence, principal=principal, spec=args.spec)
            note_verdict(result.verdict, job_id=args.spec.job_id, pid=args.spec.pid)
        return job_wire.start_to_proto(result)

    @rpc
    def FinishJob(  # noqa: N802
        self, request: worker_pb2.FinishJobRequest, context: grpc.ServicerContext
    ) -> worker_pb2.FinishJobResponse:
        """Record how a job ended (no fence: it is evidence), once."""
        args = requests.parse_finish_job(request)
        principal = principal_of(context)
        with bound(task_id=args.task_id, principal=principal):
            result = self._store.jobs.finish(
                args.task_id,
                args.job_id,
                principal=principal,
                state=args.state,
                exit_code=args.exit_code,
                detail=args.detail,
            )
            note(
                job_id=args.job_id,
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
        identity = identity_of(context)
        page = requests.parse_list_jobs(request, identity.principal)
        worker = page.worker_id
        if worker != identity.principal and not identity.may(frozenset({Role.ADMIN})):
            raise PermissionDenied(
                f"{identity.principal!r} may list only its own jobs, not those of {worker!r}"
            )
        jobs, position = self._store.jobs.list_jobs(
            worker, page_size=page.page_size, page_token=page.page_token
        )
        return job_wire.jobs_to_proto(jobs, position, worker)


def _renewed_ok(answer: RenewAnswer) -> bool:
    return not isinstance(answer, CoordinatorError) and answer.verdict.accepted
