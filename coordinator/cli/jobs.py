"""``coordinator jobs``: a worker's managed job records (the authority on its commands).

One line per job: id, task, state (with the exit code once it ended), whether its attempt still
holds the claim, pid@host, generation, log and command; ``--json`` prints one object per line.
Listing another worker's jobs takes the admin role.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from typing import Any

import click

from coordinator.cli.remote import connect, remote_options, remote_settings
from coordinator.cli.task_views import shown
from coordinator.domain.jobs import JobRecord
from coordinator.sdk.managed import job_from_proto
from coordinator.v1 import worker_pb2


def format_job(job: JobRecord, current: bool) -> str:
    """One human line about a job."""
    state = job.state.name if not job.terminal else f"{job.state.name}({job.exit_code})"
    holds = "current" if current else "not-current"
    return (
        f"{job.job_id} task={job.task_id} {state} {holds} pid={job.pid}@{job.host} "
        f"gen={job.claim_generation} log={job.log_ref} argv={shlex.join(job.argv)}"
    )


def job_json(job: JobRecord, current: bool) -> dict[str, Any]:
    """The job as one JSON object."""
    out = {k: v for k, v in asdict(job).items() if k != "mod_revision"}
    out.update(state=job.state.name, argv=list(job.argv), current=current)
    return out


@click.command()
@click.option(
    "--worker",
    "worker_id",
    default="",
    help="Whose jobs (a principal); default: the caller's own. Others' need the admin role.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@remote_options
def jobs(worker_id: str, as_json: bool, **settings: Any) -> None:
    """List a worker's managed jobs, each with whether its attempt still holds the claim."""
    statuses: list[worker_pb2.JobStatus] = []
    with connect(**remote_settings(settings)) as conn:
        request = worker_pb2.ListJobsRequest(worker_id=worker_id, page_size=1000)
        while True:
            response = conn.call(conn.worker.ListJobs, request)
            statuses += response.jobs
            if not response.next_page_token:
                break
            request.page_token = response.next_page_token
    if not statuses:
        whose = f"worker {worker_id!r}" if worker_id else "the calling principal"
        click.echo(
            f"no managed jobs for {whose}"
            + ("" if worker_id else " (--worker PRINCIPAL lists a worker's jobs)"),
            err=True,
        )
    for status in statuses:
        job = job_from_proto(status.job)
        click.echo(
            json.dumps(job_json(job, status.current))
            if as_json
            else shown(format_job(job, status.current))
        )
