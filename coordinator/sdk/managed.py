"""Managed jobs: external commands bound to the attempt that started them.

``claim.run(argv)`` starts a command as a managed job:

1. a small leader process (``_jobwrap.py``) starts in its own session, so the job is one process
   group; its output goes to a log file (the job's ``log_ref``), and it waits at a gate;
2. StartJob records the job (pid, process start time, argv, log) behind the claim's fence; only
   if that is accepted is the gate opened and the command run. A FENCED start writes nothing,
   the leader exits without running anything, the Claim is marked lost and ClaimLost is raised;
3. a watcher thread follows the process and the claim: when the Claim is lost (fenced, expired,
   cancelled, stalled) or ends (commit, release), or on ``kill()``, the WHOLE group gets SIGTERM,
   then SIGKILL after the grace period, so no command outlives its authority; a client that
   closes, and a process that exits (a script that committed, a pool that gave its claims back
   on SIGTERM), first wait for the watchers that have such a kill to make (``settle``);
4. the end is recorded with FinishJob: EXITED with the command's status, or KILLED.

Steps 1 and 2 are sdk/_jobstart.py's (``run_managed``), the watcher and the end this module's.
After a worker restart, ``rediscover`` (sdk/rediscover.py) finds the jobs again from their
records.

Commands run with plain ``subprocess`` are none of this: no record, no kill on claim loss, not
recoverable after a restart.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import structlog

from coordinator.domain.jobs import (
    JobRecord,
    JobState,
)
from coordinator.errors import CoordinatorError
from coordinator.sdk import _proc
from coordinator.sdk._core.attempt import HeldAttempt
from coordinator.sdk._duration import Duration, as_timedelta, timeout_seconds
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.types import (
    ClaimLost,
    timestamp,
)
from coordinator.v1 import worker_pb2

log = structlog.get_logger(__name__)

DEFAULT_GRACE = timedelta(seconds=10)
"""Time between SIGTERM and SIGKILL of a job's process group."""

MARKER_ENV = "COORDINATOR_JOB_ID"
"""Set to the job id in the environment of every process of a managed job."""

LOG_DIR_ENV = "COORDINATOR_JOB_LOG_DIR"
"""Where job logs go by default (else ``$TMPDIR/coordinator-jobs``)."""

_POLL = 0.05

_EXIT_MARGIN = 2.0
"""Seconds past its grace that an exiting process waits for a watcher's kill (its SIGKILL is
sent at the grace's end)."""

_watching: set[ManagedProcess] = set()
"""The handles whose watcher runs (what an exiting process looks through)."""
_watching_lock = threading.Lock()


def default_log_dir() -> Path:
    """``$COORDINATOR_JOB_LOG_DIR``, else ``<tmp>/coordinator-jobs``."""
    configured = os.environ.get(LOG_DIR_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "coordinator-jobs"


def job_log_path(log_dir: str | os.PathLike[str], task_id: str, job_id: str) -> Path:
    """``<log_dir>/<task_id>/<job_id>.log`` resolved, and refused if that is not inside log_dir.

    The task id comes from the server and the directory may hold links: whatever they are
    (``..``, an absolute name, a symlink planted in the directory), a job must not write its log
    and exit file anywhere else. Raises CoordinatorError naming the path and the directory.
    """
    base = Path(log_dir).resolve()
    path = (base / task_id / f"{job_id}.log").resolve()
    if path.parent == base or not path.is_relative_to(base):
        raise CoordinatorError(
            f"job {job_id} of task {task_id!r}: its log path {str(path)!r} is not inside the "
            f"log directory {str(base)!r}; refusing to write there"
        )
    return path


def exit_ref(log_ref: str) -> str:
    """Where the job's leader writes the command's exit status (next to the log)."""
    return f"{log_ref}.exit"


def read_exit_code(log_ref: str) -> int | None:
    """The exit status a job left behind, or None if it did not (yet) end by itself."""
    try:
        return int(Path(exit_ref(log_ref)).read_text(encoding="ascii"))
    except (OSError, ValueError):
        return None


def job_from_proto(msg: worker_pb2.Job) -> JobRecord:
    """A wire job as the domain record (times as float seconds)."""
    started, ended = timestamp(msg.started_at), timestamp(msg.ended_at)
    return JobRecord(
        job_id=msg.job_id,
        task_id=msg.task_id,
        attempt_id=msg.attempt_id,
        claim_generation=msg.claim_generation,
        scheduler_epoch=msg.scheduler_epoch,
        cancel_generation=msg.cancel_generation,
        worker_id=msg.worker_id,
        host=msg.host,
        pid=msg.pid,
        start_ticks=msg.start_ticks,
        argv=tuple(msg.argv),
        log_ref=msg.log_ref,
        state=JobState(msg.state),
        exit_code=msg.exit_code,
        detail=msg.detail,
        started_at=started.timestamp() if started else 0.0,
        ended_at=ended.timestamp() if ended else 0.0,
    )


@dataclass(frozen=True)
class JobResult:
    """How a managed job ended, and the record FinishJob left (None if it was unreachable)."""

    state: JobState
    exit_code: int
    detail: str
    record: JobRecord | None
    # Whether this FinishJob wrote the end (False: the record was already terminal, or the
    # coordinator could not be reached; ``record`` tells which).
    recorded: bool


class ManagedProcess:
    """A running managed job: wait for it, kill it, cite it as evidence.

    Built by ``Claim.run`` (the SDK spawned it and watches its Claim) or by ``rediscover`` (a
    re-attached job; ``bind`` a Claim to have it killed when that Claim is lost).
    """

    def __init__(
        self,
        rpc: Rpc,
        record: JobRecord,
        *,
        grace: Duration,
        popen: subprocess.Popen[bytes] | None = None,
        claim: HeldAttempt | None = None,
    ) -> None:
        self._rpc = rpc
        self.record = record
        self.grace = as_timedelta(grace, "grace")
        self._popen = popen
        self._claim = claim
        self._kill_reason: str | None = None
        self._wake = threading.Event()
        self._done = threading.Event()
        self._result: JobResult | None = None
        self._thread = threading.Thread(
            target=self._watch, name=f"managed-{record.job_id}", daemon=True
        )

    @property
    def job_id(self) -> str:
        """The job's id (also in its processes' environment as COORDINATOR_JOB_ID)."""
        return self.record.job_id

    @property
    def pid(self) -> int:
        """The process group leader's pid (= the group id)."""
        return self.record.pid

    @property
    def log_ref(self) -> str:
        """The log file with the job's output."""
        return self.record.log_ref

    @property
    def evidence(self) -> tuple[str, str]:
        """What a commit cites for this job: its id and its log."""
        return (self.record.job_id, self.record.log_ref)

    @property
    def result(self) -> JobResult | None:
        """How the job ended, once it has (None while it runs)."""
        return self._result

    def alive(self) -> bool:
        """Whether the job's leader process is still running."""
        return _proc.is_running(self.record.pid, self.record.start_ticks)

    def bind(self, claim: HeldAttempt) -> None:
        """Kill this (re-attached) job when ``claim`` is lost or ends."""
        self._claim = claim

    def wait(self, timeout: Duration | None = None) -> JobResult | None:
        """Block until the job ended and its end was recorded; None on timeout."""
        self._done.wait(timeout_seconds(timeout))
        return self._result

    def kill(self, reason: str = "killed by the caller") -> JobResult:
        """Terminate the job's group (SIGTERM, SIGKILL after the grace) and record KILLED."""
        if self._kill_reason is None:
            self._kill_reason = reason
        self._wake.set()
        self._done.wait()
        assert self._result is not None
        return self._result

    def _start(self) -> ManagedProcess:
        with _watching_lock:
            _watching.add(self)
        self._thread.start()
        return self

    def _why_kill(self) -> str | None:
        """Why the job has to be killed now (``kill()`` was called, or its Claim is lost or
        ended), or None."""
        if self._kill_reason is not None:
            return self._kill_reason
        claim = self._claim
        if claim is not None:
            try:
                claim.check(margin=timedelta(0))
            except ClaimLost as exc:
                return f"claim lost: {exc}"
        return None

    # --- the watcher ----------------------------------------------------------------------

    def _watch(self) -> None:
        try:
            self._result = self._run_to_end()
        except Exception as exc:  # the handle must still answer wait() and kill()
            log.exception("managed job watcher failed", job_id=self.job_id)
            self._result = JobResult(JobState.LOST, 0, f"watcher failed: {exc!r}", None, False)
        finally:
            self._done.set()
            with _watching_lock:
                _watching.discard(self)

    def _run_to_end(self) -> JobResult:
        try:
            reason = self._until_end()
            if reason is None:
                state, code, detail = self._ended()
            else:
                state, code, detail = self._terminate(reason)
        except Exception as exc:  # never leave a job running because the watcher broke
            log.exception("managed job watcher failed; killing the job", job_id=self.job_id)
            state, code, detail = self._terminate(f"watcher failed: {exc!r}")
        return finish(self._rpc, self.record, state, code, detail)

    def _until_end(self) -> str | None:
        """Wait until the leader exits (None) or the job must be killed (the reason)."""
        while True:
            if self._leader_exited():
                return None
            reason = self._why_kill()
            if reason is not None:
                return reason
            self._wake.wait(_POLL)

    def _leader_exited(self) -> bool:
        if self._popen is None:
            return not self.alive()
        # Peek without reaping: while the leader is an unreaped child, its pid (the group id)
        # cannot be reused, so signalling the group stays safe.
        flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
        return os.waitid(os.P_PID, self._popen.pid, flags) is not None

    def _ended(self) -> tuple[JobState, int, str]:
        """The leader exited by itself: stop stragglers of its group, read its status."""
        leftovers = _proc.group_members(self.pid)
        if leftovers:
            self._stop_group()
        code = read_exit_code(self.log_ref)
        if self._popen is not None:
            returncode = self._popen.wait()
            status = code if code is not None else returncode
            return JobState.EXITED, status, _straggler_note(leftovers)
        if code is not None:
            return JobState.EXITED, code, _straggler_note(leftovers)
        return JobState.LOST, 0, "the process ended unobserved and left no exit status"

    def _terminate(self, reason: str) -> tuple[JobState, int, str]:
        gone = self._stop_group()
        code = self._popen.wait() if self._popen is not None else 0
        if not gone:
            reason += " (some processes did not die after SIGKILL)"
        return JobState.KILLED, code, reason

    def _stop_group(self) -> bool:
        grace = self.grace.total_seconds()
        if self._popen is not None:
            return _proc.terminate_group(self.pid, grace)
        return kill_unowned(self.record, self.grace)

    def __repr__(self) -> str:
        state = self._result.state.name if self._result else "RUNNING"
        return f"ManagedProcess({self.job_id}, pid={self.pid}, {state})"


def settle(rpc: Rpc | None = None) -> None:
    """Wait for every watcher (of ``rpc``'s jobs, or all) that has a job to kill: its Claim
    ended or was lost, or ``kill()`` was called; all of them together at most the longest grace
    and _EXIT_MARGIN, each kill's SIGKILL being sent at its grace's end. A client calls it
    before it closes its channel (the watcher's FinishJob goes over it), and the interpreter at
    its exit: the watchers are daemon threads, and a worker that gave its claims back on
    SIGTERM, or a script that committed, used to exit first and leave the job running and
    RUNNING. A job whose Claim is still held is left to run, as after a crash (``rediscover``
    re-attaches it)."""
    with _watching_lock:
        ending = [
            p for p in _watching if (rpc is None or p._rpc is rpc) and p._why_kill() is not None
        ]
    for process in ending:
        process._wake.set()
    # The kills run at once, each on its own watcher: one deadline for them all, not one each
    # in turn (500 stuck jobs would have held an exit for hours).
    longest = max((p.grace.total_seconds() for p in ending), default=0.0)
    deadline = time.monotonic() + longest + _EXIT_MARGIN
    for process in ending:
        if not process._done.wait(max(deadline - time.monotonic(), 0.0)):
            log.warning("going on before a managed job's kill was recorded", job_id=process.job_id)


atexit.register(settle)


def _straggler_note(leftovers: list[int]) -> str:
    if not leftovers:
        return ""
    return f"{len(leftovers)} process(es) of the group outlived the command and were stopped"


def kill_unowned(record: JobRecord, grace: timedelta) -> bool:
    """Terminate the group of a job this process did not spawn, if it is still that job's.

    The group is signalled only while its leader has the record's pid AND start time, or while
    a member carries the job's id in its environment (the leader may have died first): a pid
    reused by another process is never signalled.
    """
    marker = f"{MARKER_ENV}={record.job_id}".encode()

    def still_ours() -> bool:
        if _proc.is_running(record.pid, record.start_ticks):
            return True
        return any(_proc.has_marker(pid, marker) for pid in _proc.group_members(record.pid))

    return _proc.terminate_group(record.pid, grace.total_seconds(), still_ours=still_ours)


def finish(rpc: Rpc, record: JobRecord, state: JobState, code: int, detail: str) -> JobResult:
    """Record the end with FinishJob; a failure to reach the coordinator is logged, not raised
    (``rediscover`` after a restart records it then)."""
    request = worker_pb2.FinishJobRequest(
        task_id=record.task_id,
        job_id=record.job_id,
        state=worker_pb2.JobState.ValueType(int(state)),
        exit_code=code,
        detail=detail[:1000],
    )
    try:
        response = rpc.call(rpc.worker.FinishJob, request)
    except CoordinatorError as exc:
        log.warning("FinishJob failed", job_id=record.job_id, state=state.name, error=str(exc))
        return JobResult(state, code, detail, None, recorded=False)
    return JobResult(state, code, detail, job_from_proto(response.job), response.recorded)
