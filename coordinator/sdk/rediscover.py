"""After a worker restart: find the worker's managed jobs again and act on each record.

``rediscover`` lists the worker's job records (ListJobs: each with whether its attempt still
holds the claim, compared by the server) and applies coordinator.domain.jobs.decide_rediscover
with what this host can see in /proc:

* a running job of a still-current attempt is re-attached: a ManagedProcess handle that can
  wait for and kill it (``resume_claim`` rebuilds the attempt's Claim from the record's fence, and
  ``handle.bind(claim)`` kills the job when that Claim is lost or ends);
* a running job of a superseded attempt is killed - its whole group, and only while a process
  with the recorded pid AND start time (or the job's id in its environment) exists: a reused
  pid is never signalled - and recorded KILLED;
* a job whose process ended while nobody watched is recorded EXITED with the status its leader
  left next to the log, or LOST if there is none;
* terminal records are reported as they are; running records of another host are left alone.
"""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass

import structlog

from coordinator.domain.decisions import Fence
from coordinator.domain.jobs import (
    JobRecord,
    JobState,
    JobStatus,
    RediscoverAction,
    decide_rediscover,
)
from coordinator.fence_wire import fence_to_proto
from coordinator.sdk import _proc
from coordinator.sdk._duration import Duration, as_timedelta
from coordinator.sdk._renewer import Renewer
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.claim import Claim, LostCallback
from coordinator.sdk.managed import (
    DEFAULT_GRACE,
    ManagedProcess,
    finish,
    job_from_proto,
    kill_unowned,
    read_exit_code,
)
from coordinator.sdk.tasks import TaskInfo
from coordinator.sdk.types import ClaimLost
from coordinator.v1 import worker_pb2

log = structlog.get_logger(__name__)


ListedJob = JobStatus
"""A job record and whether its attempt still holds the claim (compared by the server)."""


@dataclass(frozen=True)
class Rediscovered:
    """What ``rediscover`` did with one job: the record after it, and for a re-attached job
    the handle to wait for or kill it."""

    job: JobRecord
    action: RediscoverAction
    current: bool
    process: ManagedProcess | None = None


MAX_PAGE = 1000
"""Jobs asked for a page (the server ends one sooner past about 1 MiB)."""


def resume_claim(
    rpc: Rpc,
    record: JobRecord,
    task: TaskInfo,
    *,
    ttl: Duration,
    on_lost: LostCallback | None = None,
    renewer: Renewer | None = None,
) -> Claim:
    """A Claim for the attempt of a re-attached job (its fence is in the record), so a restarted
    worker can renew the claim and commit. Raises ClaimLost if the task moved to another attempt.

    The lease's remaining time is unknown after a restart: the local lease clock starts now, and
    the first renewal (at TTL/3) asks the server, which fences the Claim if the lease ran out.
    """
    if task.attempt_id != record.attempt_id or task.claim_generation != record.claim_generation:
        raise ClaimLost(
            f"task {record.task_id} is at attempt {task.attempt_id} (generation "
            f"{task.claim_generation}), not the job's {record.attempt_id} "
            f"(generation {record.claim_generation})"
        )
    fence = Fence(
        task_id=record.task_id,
        attempt_id=record.attempt_id,
        claim_generation=record.claim_generation,
        scheduler_epoch=record.scheduler_epoch,
        cancel_generation=record.cancel_generation,
    )
    claim = worker_pb2.ClaimResponse(
        fence=fence_to_proto(fence),
        attempt=task.attempt,
        ttl_seconds=max(1, math.ceil(as_timedelta(ttl, "ttl").total_seconds())),
        input_digest=task.input_digest,
        input=task.input,
        task_revision=task.revision,
    )
    return Claim(rpc, claim, sent_at=time.monotonic(), on_lost=on_lost, renewer=renewer)


def list_jobs(rpc: Rpc, worker_id: str = "", *, retry: bool = True) -> list[ListedJob]:
    """A worker's job records (the caller's own when ``worker_id`` is empty), every page;
    without ``retry``, one try a page."""
    found: list[ListedJob] = []
    request = worker_pb2.ListJobsRequest(worker_id=worker_id, page_size=MAX_PAGE)
    while True:
        response = rpc.call(rpc.worker.ListJobs, request, retry=retry)
        found += [ListedJob(job_from_proto(s.job), s.current) for s in response.jobs]
        if not response.next_page_token:
            return found
        request.page_token = response.next_page_token


def rediscover(
    rpc: Rpc, worker_id: str = "", *, grace: Duration = DEFAULT_GRACE, host: str | None = None
) -> list[Rediscovered]:
    """Act on every job record of a (restarted) worker; see the module doc."""
    here = host if host is not None else socket.gethostname()
    found: list[Rediscovered] = []
    for listed in list_jobs(rpc, worker_id):
        record, current = listed.job, listed.current
        local = record.host == here
        matches = local and _proc.is_running(record.pid, record.start_ticks)
        code = read_exit_code(record.log_ref) if local and not record.terminal else None
        action = decide_rediscover(
            record, current=current, on_this_host=local, process_matches=matches, exit_code=code
        )
        after, process = record, None
        if action is RediscoverAction.REATTACH:
            process = ManagedProcess(rpc, record, grace=grace)._start()
        elif action is RediscoverAction.KILL:
            after = _kill_superseded(rpc, record, grace)
        elif action is RediscoverAction.RECORD_EXIT:
            assert code is not None
            result = finish(rpc, record, JobState.EXITED, code, "ended while its worker was down")
            after = result.record or record
        elif action is RediscoverAction.MARK_LOST:
            detail = "its process is gone (pid absent or started at another time)"
            after = finish(rpc, record, JobState.LOST, 0, detail).record or record
        log.info(
            "rediscovered job",
            job_id=record.job_id,
            task_id=record.task_id,
            action=action.value,
            current=current,
            state=after.state.name,
        )
        found.append(Rediscovered(after, action, current, process))
    return found


def _kill_superseded(rpc: Rpc, record: JobRecord, grace: Duration) -> JobRecord:
    """Terminate the group of a job whose attempt was superseded (pid and start time checked)
    and record it KILLED; the record after."""
    gone = kill_unowned(record, as_timedelta(grace, "grace"))
    detail = f"its attempt (generation {record.claim_generation}) no longer holds the claim"
    result = finish(rpc, record, JobState.KILLED, 0, detail + ("" if gone else "; stuck"))
    return result.record or record


def kill_orphans(
    rpc: Rpc, worker_id: str = "", *, grace: Duration = DEFAULT_GRACE, host: str | None = None
) -> list[JobRecord]:
    """Kill the worker's jobs running on this host whose attempts no longer hold their claims
    (a worker process killed while its jobs ran leaves them running), and only those: jobs of
    current attempts may be another process's of the same principal (a pool's pods share a
    token). What ``coordinator worker`` does as it starts: one try, so that a coordinator not
    reachable yet does not hold the worker's start up. The records after, killed ones."""
    here = host if host is not None else socket.gethostname()
    killed = []
    for listed in list_jobs(rpc, worker_id, retry=False):
        record = listed.job
        if listed.current or record.terminal or record.host != here:
            continue
        if not _proc.is_running(record.pid, record.start_ticks):
            continue
        killed.append(_kill_superseded(rpc, record, grace))
        log.warning("killed an orphaned job", job_id=record.job_id, task_id=record.task_id)
    return killed
