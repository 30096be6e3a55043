"""Managed jobs on the wire: StartJob, FinishJob and ListJobs, and a commit's evidence.
Pure and mechanical (see common_wire); JobState converts by value.
"""

from __future__ import annotations

from coordinator.domain import jobs as domain
from coordinator.domain import validation
from coordinator.domain.jobs import JobRecord, JobState, JobStatus
from coordinator.domain.roles import check_principal
from coordinator.domain.states import Outcome
from coordinator.errors import InvalidArgument
from coordinator.server.wire import page_tokens
from coordinator.server.wire.common_wire import (
    outcome_to_proto,
    parse_required_positive,
    timestamp_to_proto,
    verdict_fields,
)
from coordinator.store.effects.jobs import FinishJobResult, JobSpec, StartJobResult
from coordinator.v1 import worker_pb2

_LIST_JOBS = "ListJobs"

# --- proto -> domain -------------------------------------------------------------------------


def parse_start_spec(request: worker_pb2.StartJobRequest) -> JobSpec:
    """The job StartJob records (the fence is checked separately)."""
    return JobSpec(
        job_id=domain.check_job_id(request.job_id),
        host=domain.check_host(request.host),
        pid=parse_required_positive("pid", request.pid),
        start_ticks=parse_required_positive("start_ticks", request.start_ticks),
        argv=domain.check_argv(list(request.argv)),
        log_ref=domain.check_log_ref(request.log_ref),
    )


def parse_finish_state(value: int) -> JobState:
    """FinishJob's state: EXITED, KILLED or LOST."""
    return domain.check_finish_state(value)


def parse_detail(value: str) -> str:
    """A free-text note on how the job ended."""
    return validation.text("detail", value)


def parse_worker_id(value: str) -> str:
    """A worker to list jobs of (a principal name); empty means the caller."""
    return check_principal("worker_id", value) if value else ""


def parse_evidence(values: list[str]) -> tuple[str, ...]:
    """A commit's evidence references."""
    return domain.check_evidence(values)


def parse_task_and_job(task_id: str, job_id: str) -> tuple[str, str]:
    """The job a FinishJob names."""
    if not task_id:
        raise InvalidArgument("task_id is required")
    return validation.task_id(task_id), domain.check_job_id(job_id)


# --- domain -> proto -------------------------------------------------------------------------


def job_to_proto(job: JobRecord) -> worker_pb2.Job:
    """A job record on the wire."""
    return worker_pb2.Job(
        job_id=job.job_id,
        task_id=job.task_id,
        attempt_id=job.attempt_id,
        claim_generation=job.claim_generation,
        scheduler_epoch=job.scheduler_epoch,
        cancel_generation=job.cancel_generation,
        worker_id=job.worker_id,
        host=job.host,
        pid=job.pid,
        start_ticks=job.start_ticks,
        argv=list(job.argv),
        log_ref=job.log_ref,
        state=worker_pb2.JobState.ValueType(int(job.state)),
        exit_code=job.exit_code,
        detail=job.detail,
        started_at=timestamp_to_proto(job.started_at),
        ended_at=timestamp_to_proto(job.ended_at),
    )


def start_to_proto(result: StartJobResult) -> worker_pb2.StartJobResponse:
    """StartJobResponse; the record when it was written."""
    response = worker_pb2.StartJobResponse(**verdict_fields(result.verdict))
    if result.job is not None:
        response.job.CopyFrom(job_to_proto(result.job))
    return response


def finish_to_proto(result: FinishJobResult) -> worker_pb2.FinishJobResponse:
    """FinishJobResponse: always OK, with the record as stored."""
    return worker_pb2.FinishJobResponse(
        outcome=outcome_to_proto(Outcome.OK),
        job=job_to_proto(result.job),
        recorded=result.recorded,
    )


def parse_jobs_page_token(value: str, worker: str) -> str:
    """A ListJobs page token (the previous page's last job id) of the same worker; empty: the
    first page."""
    return page_tokens.parse(_LIST_JOBS, {"worker_id": worker}, value, domain.check_job_id)


def jobs_to_proto(jobs: list[JobStatus], position: str, worker: str) -> worker_pb2.ListJobsResponse:
    """ListJobsResponse: a page of ``worker``'s jobs that ended at ``position``."""
    return worker_pb2.ListJobsResponse(
        jobs=[worker_pb2.JobStatus(job=job_to_proto(s.job), current=s.current) for s in jobs],
        next_page_token=page_tokens.issue(_LIST_JOBS, {"worker_id": worker}, position),
    )
