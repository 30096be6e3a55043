"""Managed job records in etcd: StartJob (an acceptance point), FinishJob and ListJobs.

StartJob is fenced like every acceptance point: read the FenceView, ``check_owner`` and
``check_fence`` in the domain, then create the record behind ``fence_compares`` plus
``create_revision == 0`` on the job key; a failed txn is diagnosed from a fresh read. A fenced
start writes nothing, so a job can only ever be recorded for an attempt that held its claim.

FinishJob is deliberately not fenced: how a job ended is evidence, wanted most when the claim
was lost (that is when the SDK kills jobs). It is guarded instead by the owner (only the worker
that started the job) and by a CAS on the record's mod_revision, and ``decide_finish`` keeps a
terminal record as it is.

The per-worker index ``{p}/jobs-by-worker/{worker}/{job_id}`` (value: task id) is written in
the start txn; ListJobs reads it, then the records and, per job, the claim key, task key and
epoch at one revision to say whether the job's attempt is still current.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.decisions import Fence, Verdict, check_fence, check_owner
from coordinator.domain.jobs import (
    FinishVerdict,
    JobRecord,
    JobState,
    JobStatus,
    decide_finish,
    same_start,
)
from coordinator.domain.records import decode, encode, with_changes
from coordinator.domain.states import Outcome
from coordinator.errors import (
    AlreadyExists,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    StoreUnavailable,
)
from coordinator.metrics import AcceptancePoint
from coordinator.store import coverage
from coordinator.store.attempts.acceptance import AcceptancePoints
from coordinator.store.context import StoreContext, epoch_from_kv
from coordinator.store.etcd.ops import (
    KV,
    create_revision_is,
    get,
    get_prefix,
    mod_revision_is,
    put,
)
from coordinator.store.fence import fence_compares

# A finish whose CAS lost to another finish of the same job reads again (and then finds it
# terminal); more tries than that mean something else keeps rewriting the record.
_FINISH_TRIES = 3
MAX_JOBS_PER_TASK = 256
"""Job records one task holds at most (every attempt's, until retention prunes them): a worker
starting a job per call once recorded 2,752 of 20 KB for one claim in 15 s."""
JOBS_PER_READ = 32
"""Jobs read at once: each its record (at most about 40 KiB: 16 Ki characters of argv, JSON
escaped), its claim key and its task key without values (revisions only), 3 ops of etcd's 128;
32 records stay under the client's 4 MiB message limit."""
PAGE_BYTES = 1 << 20
"""Bytes of job records one ListJobs page carries at most (one record more when the first is
larger): 2,752 jobs once made one 50 MiB answer."""


@dataclass(frozen=True)
class JobSpec:
    """What StartJob records about a process the worker is about to let run."""

    job_id: str
    host: str
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    log_ref: str


@dataclass(frozen=True)
class StartJobResult:
    """Outcome of StartJob; ``job`` is set when the outcome is OK."""

    verdict: Verdict
    job: JobRecord | None = None


@dataclass(frozen=True)
class FinishJobResult:
    """The record after FinishJob; ``recorded`` is False when it was already terminal."""

    job: JobRecord
    recorded: bool


def job_from_kv(kv: KV) -> JobRecord:
    """Decode a job record with its key's mod_revision."""
    return decode(JobRecord, kv.value, mod_revision=kv.mod_revision)


class JobStore:
    """StartJob, FinishJob and ListJobs."""

    def __init__(self, ctx: StoreContext, points: AcceptancePoints) -> None:
        self._ctx = ctx
        self._points = points

    def start(self, fence: Fence, *, principal: str, spec: JobSpec) -> StartJobResult:
        """Record a job of the caller's attempt, behind the fence; FENCED writes nothing."""
        ctx, keys = self._ctx, self._ctx.keys
        view = self._points.view(fence)
        check_owner(view, fence, principal)
        verdict = check_fence(view, fence, now=ctx.clock.now())
        if not verdict.accepted:
            return StartJobResult(verdict)
        self._check_room(fence.task_id, spec.job_id)
        record = JobRecord(
            job_id=spec.job_id,
            task_id=fence.task_id,
            attempt_id=fence.attempt_id,
            claim_generation=fence.claim_generation,
            scheduler_epoch=fence.scheduler_epoch,
            cancel_generation=fence.cancel_generation,
            worker_id=principal,
            host=spec.host,
            pid=spec.pid,
            start_ticks=spec.start_ticks,
            argv=spec.argv,
            log_ref=spec.log_ref,
            started_at=ctx.clock.now(),
        )
        key = keys.job(fence.task_id, spec.job_id)
        index = keys.worker_job(principal, spec.job_id)
        compares = [
            *fence_compares(keys, fence),
            create_revision_is(key, 0),
            create_revision_is(index, 0),  # a job id names one job of the worker, ever
        ]
        ops = [put(key, encode(record)), put(index, fence.task_id.encode())]
        txn = ctx.kv.txn(compares, ops, failure=[get(key), get(index)])
        if txn.succeeded:
            coverage.observe_fence(AcceptancePoint.START_JOB, compares, ctx, fence)
            return StartJobResult(verdict, with_changes(record, mod_revision=txn.revision))
        existing_kv, index_kv = txn.range_one(0), txn.range_one(1)
        if existing_kv is not None:
            existing = job_from_kv(existing_kv)
            if same_start(existing, record):  # a retry whose first try landed
                return StartJobResult(Verdict(Outcome.OK), existing)
            raise AlreadyExists(
                f"job {spec.job_id!r} of task {fence.task_id!r} exists already "
                f"(pid {existing.pid} on {existing.host!r}); choose a new job_id"
            )
        if index_kv is not None:
            raise AlreadyExists(
                f"job id {spec.job_id!r} is already used by {principal!r} for task "
                f"{index_kv.value.decode()!r}; choose a new job_id"
            )
        return StartJobResult(self._points.diagnose(fence))

    def finish(
        self,
        task_id: str,
        job_id: str,
        *,
        principal: str,
        state: JobState,
        exit_code: int,
        detail: str,
    ) -> FinishJobResult:
        """Record how the job ended, unless it already has (CAS on the record)."""
        ctx = self._ctx
        key = ctx.keys.job(task_id, job_id)
        for _ in range(_FINISH_TRIES):
            record = self.get(task_id, job_id)
            if record.worker_id != principal:
                raise PermissionDenied(
                    f"job {job_id!r} of task {task_id!r} belongs to {record.worker_id!r}, "
                    f"not to {principal!r}"
                )
            if decide_finish(record, state) is FinishVerdict.ALREADY_FINAL:
                return FinishJobResult(record, recorded=False)
            after = with_changes(
                record, state=state, exit_code=exit_code, detail=detail, ended_at=ctx.clock.now()
            )
            txn = ctx.kv.txn([mod_revision_is(key, record.mod_revision)], [put(key, encode(after))])
            if txn.succeeded:
                return FinishJobResult(
                    with_changes(after, mod_revision=txn.revision), recorded=True
                )
        raise StoreUnavailable(f"job {job_id!r} kept changing during FinishJob; try again")

    def get(self, task_id: str, job_id: str) -> JobRecord:
        """One job record, or NotFound."""
        kv = self._ctx.kv.get(self._ctx.keys.job(task_id, job_id))
        if kv is None:
            raise NotFound(f"job {job_id!r} of task {task_id!r} does not exist")
        return job_from_kv(kv)

    def _check_room(self, task_id: str, job_id: str) -> None:
        """ResourceExhausted if the task holds MAX_JOBS_PER_TASK job records and ``job_id`` is
        not one of them (a retry of a start that landed goes on to be answered as one). Read
        before the txn: concurrent starts may pass the bound by their number, never more."""
        keys = self._ctx.keys
        snap = self._ctx.kv.read(
            get_prefix(keys.jobs_prefix(task_id), count_only=True),
            get(keys.job(task_id, job_id), keys_only=True),
        )
        if snap.range_count(0) >= MAX_JOBS_PER_TASK and snap.range_one(1) is None:
            raise ResourceExhausted(
                f"task {task_id!r} holds {MAX_JOBS_PER_TASK} managed job records, the limit: "
                "run more work per job, or in another task"
            )

    def list_jobs(
        self, worker_id: str, *, page_size: int, page_token: str = ""
    ) -> tuple[list[JobStatus], str]:
        """One page of the worker's jobs by job id, each with whether its attempt is still
        current, and the position the next page starts after ("" after the last)."""
        ctx, keys = self._ctx, self._ctx.keys
        prefix = keys.worker_jobs_prefix(worker_id)
        start = prefix + page_token + "\0" if page_token else prefix
        # One more than a page: whether another page follows, so the last one says so.
        index, _ = ctx.kv.range_page(start, ctx.kv.prefix_end(prefix), limit=page_size + 1)
        entries = [(kv.value.decode(), kv.key.removeprefix(prefix)) for kv in index[:page_size]]
        found: list[JobStatus] = []
        size = 0
        for first in range(0, len(entries), JOBS_PER_READ):
            batch = entries[first : first + JOBS_PER_READ]
            for n, (status, nbytes) in enumerate(self._statuses(batch)):
                if found and size + nbytes > PAGE_BYTES:  # the page is full: resume here
                    return found, entries[first + n - 1][1]
                size += nbytes
                if status is not None:
                    found.append(status)
        return found, entries[-1][1] if len(index) > page_size else ""

    def _statuses(self, batch: list[tuple[str, str]]) -> list[tuple[JobStatus | None, int]]:
        """Each (task id, job id)'s status and record size, at one revision (None, 0: an index
        entry without its record, doctor's business)."""
        keys = self._ctx.keys
        reads = [get(keys.epoch)]
        for task_id, job_id in batch:
            reads += [
                get(keys.job(task_id, job_id)),
                get(keys.claim(task_id), keys_only=True),
                get(keys.task(task_id), keys_only=True),
            ]
        snap = self._ctx.kv.read(*reads)
        epoch = epoch_from_kv(snap.range_one(0))
        out: list[tuple[JobStatus | None, int]] = []
        for n in range(len(batch)):
            job_kv = snap.range_one(1 + 3 * n)
            if job_kv is None:
                out.append((None, 0))
                continue
            job = job_from_kv(job_kv)
            claim_kv, task_kv = snap.range_one(2 + 3 * n), snap.range_one(3 + 3 * n)
            out.append((JobStatus(job, _current(job, claim_kv, task_kv, epoch)), len(job_kv.value)))
        return out


def _current(job: JobRecord, claim: KV | None, task: KV | None, epoch: int) -> bool:
    """The fence of the job's attempt holds: the same compares ``fence_compares`` makes."""
    gen = job.claim_generation
    return (
        claim is not None
        and claim.create_revision == gen
        and task is not None
        and task.mod_revision == gen
        and epoch == job.scheduler_epoch
    )
