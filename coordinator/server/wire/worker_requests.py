"""WorkerService's requests, each parsed in one place: ``parse_<rpc>`` checks every field of one
RPC's request, in the order the contract lists them, and returns a typed value or raises
InvalidArgument naming the first field that is wrong. A handler calls its parse first, so a bad
request writes nothing.

The checks of single fields live in the area modules (worker_wire, effect_wire, job_wire,
common_wire, and domain/validation for identifiers); this module only says which fields each
RPC has. The owner of a call is never a request field: handlers take it from the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.decisions import Fence
from coordinator.domain.effects import EffectState
from coordinator.domain.failures import FailureReport
from coordinator.domain.jobs import JobState
from coordinator.domain.validation import non_negative, task_id
from coordinator.errors import InvalidArgument
from coordinator.server.wire import common_wire, effect_wire, job_wire, task_wire, worker_wire
from coordinator.store.attempts.renew_plans import Renewal
from coordinator.store.effects.jobs import JobSpec
from coordinator.v1 import worker_pb2


@dataclass(frozen=True)
class ClaimArgs:
    """A Claim of one task by id."""

    task_id: str
    expected_state_version: int
    epoch: int
    ttl: int


def parse_claim(request: worker_pb2.ClaimRequest) -> ClaimArgs:
    """Claim's request."""
    return ClaimArgs(
        task_id=task_id(request.task_id),
        expected_state_version=non_negative(
            "expected_state_version", request.expected_state_version
        ),
        epoch=common_wire.parse_epoch("scheduler_epoch", request.scheduler_epoch),
        ttl=worker_wire.parse_ttl("ttl_seconds", request.ttl_seconds),
    )


@dataclass(frozen=True)
class ClaimNextArgs:
    """A ClaimNext: from ClaimNext itself or from a Commit's ``next``."""

    queue: str
    epoch: int
    ttl: int
    wait: float
    max_tasks: int


def parse_claim_next(
    request: worker_pb2.ClaimNextRequest, *, max_wait: float, field: str = ""
) -> ClaimNextArgs:
    """ClaimNext's request; ``max_wait`` is the replica's bound of ``wait_seconds`` and
    ``field`` prefixes the names in errors (``next.`` inside a Commit)."""
    try:
        return ClaimNextArgs(
            queue=task_wire.parse_queue_or_default(request.queue),
            epoch=common_wire.parse_epoch("scheduler_epoch", request.scheduler_epoch),
            ttl=worker_wire.parse_ttl("ttl_seconds", request.ttl_seconds),
            wait=worker_wire.parse_wait_seconds(request.wait_seconds, max_wait),
            max_tasks=worker_wire.parse_max_tasks("max_tasks", request.max_tasks),
        )
    except InvalidArgument as exc:
        raise InvalidArgument(f"{field}{exc}") from None


def parse_renew(request: worker_pb2.RenewRequest) -> Renewal:
    """Renew's request: the fence, the progress marker and a checkpoint (if set)."""
    return worker_wire.parse_renewal(request)


def parse_renew_many(request: worker_pb2.RenewManyRequest) -> list[Renewal | InvalidArgument]:
    """RenewMany's items, each a renewal or the error naming what is wrong with it: a bad item
    is answered on its own and the others are renewed (only a batch past its bound is refused
    whole)."""
    return worker_wire.parse_renewals(request)


@dataclass(frozen=True)
class AuthorizeToolArgs:
    """An AuthorizeTool: may the holder of ``fence`` run ``tool``'s ``action`` now."""

    fence: Fence
    tool: str
    action: str


def parse_authorize_tool(request: worker_pb2.AuthorizeToolRequest) -> AuthorizeToolArgs:
    """AuthorizeTool's request."""
    return AuthorizeToolArgs(
        fence=worker_wire.parse_fence(request.fence, present=request.HasField("fence")),
        tool=common_wire.parse_text("tool", request.tool),
        action=common_wire.parse_text("action", request.action),
    )


@dataclass(frozen=True)
class StageResultArgs:
    """A StageResult: the result inline or by reference, and its checked digest."""

    fence: Fence
    result_digest: str
    result: bytes
    result_ref: str


def parse_stage_result(request: worker_pb2.StageResultRequest) -> StageResultArgs:
    """StageResult's request."""
    return StageResultArgs(
        fence=worker_wire.parse_fence(request.fence, present=request.HasField("fence")),
        result_digest=worker_wire.parse_result_payload(
            request.result, request.result_digest, request.result_ref
        ),
        result=request.result,
        result_ref=request.result_ref,
    )


@dataclass(frozen=True)
class CommitArgs:
    """A Commit, and the ClaimNext it asks for in the same call (if any)."""

    fence: Fence
    input_digest: str
    result_digest: str
    result: bytes
    result_ref: str
    evidence: tuple[str, ...]
    next: ClaimNextArgs | None


def parse_commit(request: worker_pb2.CommitRequest) -> CommitArgs:
    """Commit's request; its ``next`` never waits (a commit must not hold its caller)."""
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
        next_claim = parse_claim_next(request.next, max_wait=0.0, field="next.")
    return CommitArgs(
        fence=fence,
        input_digest=input_digest,
        result_digest=digest,
        result=request.result,
        result_ref=request.result_ref,
        evidence=evidence,
        next=next_claim,
    )


@dataclass(frozen=True)
class ReleaseArgs:
    """A Release: the task given back, with why."""

    fence: Fence
    reason: str


def parse_release(request: worker_pb2.ReleaseRequest) -> ReleaseArgs:
    """Release's request."""
    return ReleaseArgs(
        fence=worker_wire.parse_fence(request.fence, present=request.HasField("fence")),
        reason=common_wire.parse_text("reason", request.reason),
    )


@dataclass(frozen=True)
class FailArgs:
    """A Fail: the held attempt failed, with the checked report the retry decision reads."""

    fence: Fence
    report: FailureReport


def parse_fail(request: worker_pb2.FailRequest) -> FailArgs:
    """Fail's request."""
    return FailArgs(
        fence=worker_wire.parse_fence(request.fence, present=request.HasField("fence")),
        report=worker_wire.parse_failure_report(request),
    )


@dataclass(frozen=True)
class PrepareEffectArgs:
    """A PrepareEffect: the side-effect slot to bind or look up, and its payload's digest."""

    fence: Fence
    node_id: str
    effect_slot: str
    payload_digest: str


def parse_prepare_effect(request: worker_pb2.PrepareEffectRequest) -> PrepareEffectArgs:
    """PrepareEffect's request."""
    return PrepareEffectArgs(
        fence=worker_wire.parse_fence(request.fence, present=request.HasField("fence")),
        node_id=effect_wire.parse_node_id(request.node_id),
        effect_slot=effect_wire.parse_effect_slot(request.effect_slot),
        payload_digest=effect_wire.parse_payload_digest(request.payload_digest),
    )


@dataclass(frozen=True)
class RecordEffectArgs:
    """A RecordEffect: what the downstream did, and who reconciles it if it is uncertain."""

    fence: Fence
    effect_id: str
    state: EffectState
    external_ref: str
    etag: str
    reconcile_principal: str


def parse_record_effect(request: worker_pb2.RecordEffectRequest) -> RecordEffectArgs:
    """RecordEffect's request."""
    fence = worker_wire.parse_fence(request.fence, present=request.HasField("fence"))
    eid = effect_wire.parse_effect_id(request.effect_id)
    state = effect_wire.parse_recorded_state(request.state)
    return RecordEffectArgs(
        fence=fence,
        effect_id=eid,
        state=state,
        external_ref=effect_wire.parse_external_ref(request.external_ref),
        etag=effect_wire.parse_etag(request.etag),
        reconcile_principal=effect_wire.parse_reconcile_principal(
            request.reconcile_principal, state
        ),
    )


def parse_get_effect(request: worker_pb2.GetEffectRequest) -> str:
    """GetEffect's request: the effect id."""
    return effect_wire.parse_effect_id(request.effect_id)


@dataclass(frozen=True)
class ResolveEffectArgs:
    """A ResolveEffect: an uncertain effect resolved without a claim."""

    effect_id: str
    resolution: EffectState
    external_ref: str
    etag: str
    reason: str


def parse_resolve_effect(request: worker_pb2.ResolveEffectRequest) -> ResolveEffectArgs:
    """ResolveEffect's request."""
    return ResolveEffectArgs(
        effect_id=effect_wire.parse_effect_id(request.effect_id),
        resolution=effect_wire.parse_resolution(request.resolution),
        external_ref=effect_wire.parse_external_ref(request.external_ref),
        etag=effect_wire.parse_etag(request.etag),
        reason=common_wire.parse_text("reason", request.reason),
    )


@dataclass(frozen=True)
class EffectPageArgs:
    """One page of a listing of effects: of one task or all (``task_id`` empty)."""

    task_id: str
    page_size: int
    page_token: str
    rpc: str
    """The listing the token belongs to: a token of one is refused by the other."""


def _effect_page(
    request: worker_pb2.ListOpenEffectsRequest | worker_pb2.ListEffectsRequest, rpc: str
) -> EffectPageArgs:
    tid = task_id(request.task_id) if request.task_id else ""
    return EffectPageArgs(
        task_id=tid,
        page_size=common_wire.parse_page_size(request.page_size),
        page_token=effect_wire.parse_effects_page_token(request.page_token, tid, rpc),
        rpc=rpc,
    )


def parse_list_open_effects(request: worker_pb2.ListOpenEffectsRequest) -> EffectPageArgs:
    """ListOpenEffects' request."""
    return _effect_page(request, "ListOpenEffects")


def parse_list_effects(request: worker_pb2.ListEffectsRequest) -> EffectPageArgs:
    """ListEffects' request."""
    return _effect_page(request, "ListEffects")


@dataclass(frozen=True)
class StartJobArgs:
    """A StartJob: the managed job the holder's attempt started."""

    fence: Fence
    spec: JobSpec


def parse_start_job(request: worker_pb2.StartJobRequest) -> StartJobArgs:
    """StartJob's request."""
    return StartJobArgs(
        fence=worker_wire.parse_fence(request.fence, present=request.HasField("fence")),
        spec=job_wire.parse_start_spec(request),
    )


@dataclass(frozen=True)
class FinishJobArgs:
    """A FinishJob: how a job ended (evidence, so no fence)."""

    task_id: str
    job_id: str
    state: JobState
    exit_code: int
    detail: str


def parse_finish_job(request: worker_pb2.FinishJobRequest) -> FinishJobArgs:
    """FinishJob's request."""
    tid, jid = job_wire.parse_task_and_job(request.task_id, request.job_id)
    return FinishJobArgs(
        task_id=tid,
        job_id=jid,
        state=job_wire.parse_finish_state(request.state),
        exit_code=request.exit_code,
        detail=job_wire.parse_detail(request.detail),
    )


@dataclass(frozen=True)
class JobsPageArgs:
    """A ListJobs page: of ``worker_id`` (the caller's when the request names none)."""

    worker_id: str
    page_size: int
    page_token: str


def parse_list_jobs(request: worker_pb2.ListJobsRequest, caller: str) -> JobsPageArgs:
    """ListJobs' request, for ``caller`` (its token is bound to the worker listed)."""
    worker = job_wire.parse_worker_id(request.worker_id) or caller
    return JobsPageArgs(
        worker_id=worker,
        page_size=common_wire.parse_page_size(request.page_size),
        page_token=job_wire.parse_jobs_page_token(request.page_token, worker),
    )
