"""How a managed job starts (sdk/managed.py says what one is): its leader spawned at a gate,
StartJob behind the claim's fence, and only then the gate opened, so a command whose start was
refused never runs.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from coordinator.domain.jobs import check_argv
from coordinator.domain.states import FenceReason, Outcome
from coordinator.errors import CoordinatorError
from coordinator.sdk import _proc
from coordinator.sdk._core.attempt import HeldAttempt
from coordinator.sdk._duration import Duration
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.managed import (
    DEFAULT_GRACE,
    MARKER_ENV,
    ManagedProcess,
    default_log_dir,
    exit_ref,
    job_from_proto,
    job_log_path,
)
from coordinator.sdk.types import ClaimLost, LossSource, LostReason, fence_to_proto, outcome_of
from coordinator.v1 import worker_pb2

_WRAPPER = str(Path(__file__).with_name("_jobwrap.py"))


def new_job_id() -> str:
    """A fresh job id."""
    return f"j-{secrets.token_hex(8)}"


def run_managed(
    claim: HeldAttempt,
    rpc: Rpc,
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    grace: Duration = DEFAULT_GRACE,
    log_dir: str | os.PathLike[str] | None = None,
) -> ManagedProcess:
    """Start ``argv`` as a managed job of ``claim`` (see the module doc); ``rpc`` records its end
    (FinishJob carries no fence). Raises ClaimLost if the claim is lost already or StartJob is
    refused (the command then never ran)."""
    command = check_argv(list(argv))
    claim.check(margin=timedelta(0))
    task_id, job_id = claim.fence.task_id, new_job_id()
    log_path = job_log_path(log_dir or default_log_dir(), task_id, job_id)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    environment = {**(os.environ if env is None else env), MARKER_ENV: job_id}
    popen, gate = _spawn(command, log_path, cwd, environment)
    try:
        response = _start_job(claim, job_id, popen.pid, command, str(log_path))
    except BaseException:
        os.close(gate)  # the leader reads EOF and exits: the command never runs
        popen.wait()
        raise
    outcome = outcome_of(response.outcome)
    if outcome is not Outcome.OK:
        os.close(gate)
        popen.wait()
        _refused(claim, rpc, job_id, outcome, response)
    os.write(gate, b"g")
    os.close(gate)
    record = job_from_proto(response.job)
    return ManagedProcess(rpc, record, grace=grace, popen=popen, claim=claim)._start()


def _spawn(
    command: tuple[str, ...],
    log_path: Path,
    cwd: str | os.PathLike[str] | None,
    environment: Mapping[str, str],
) -> tuple[subprocess.Popen[bytes], int]:
    """The job's leader in a session of its own, writing to ``log_path`` and waiting at its
    gate; the leader and the gate's write end (closed without a byte: it exits unrun)."""
    gate_r, gate_w = os.pipe()
    leader = [sys.executable, "-I", "-S", _WRAPPER, str(gate_r), exit_ref(str(log_path))]
    try:
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                [*leader, "--", *command],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=environment,
                start_new_session=True,
                pass_fds=(gate_r,),
            )
    except BaseException:
        os.close(gate_w)
        raise
    finally:
        os.close(gate_r)
    return popen, gate_w


def _refused(
    claim: HeldAttempt,
    rpc: Rpc,
    job_id: str,
    outcome: Outcome,
    response: worker_pb2.StartJobResponse,
) -> None:
    """StartJob refused the job: close any record an earlier try left, mark the claim lost,
    raise ClaimLost."""
    task_id = claim.fence.task_id
    _close_refused(rpc, task_id, job_id, response.message)
    reason = FenceReason(response.reason)
    lost = LostReason(outcome, reason, response.message, LossSource.JOB, task_id)
    claim.mark_lost(outcome, reason, response.message, LossSource.JOB)
    raise ClaimLost(
        f"job {job_id} of task {task_id} not started: StartJob answered "
        f"{outcome.name}/{reason.name}: {response.message}",
        reason=lost,
    )


def _close_refused(rpc: Rpc, task_id: str, job_id: str, message: str) -> None:
    """A refused start wrote nothing, unless an earlier try of the same start landed before
    the claim was lost (a retry after a lost answer): then close that record, best effort."""
    request = worker_pb2.FinishJobRequest(
        task_id=task_id,
        job_id=job_id,
        state=worker_pb2.JOB_STATE_KILLED,
        detail=f"never started: StartJob was refused ({message})"[:1000],
    )
    with contextlib.suppress(CoordinatorError):  # NotFound: the usual case, nothing written
        rpc.call(rpc.worker.FinishJob, request, retry=False)


def _start_job(
    claim: HeldAttempt, job_id: str, pid: int, argv: tuple[str, ...], log_ref: str
) -> worker_pb2.StartJobResponse:
    ticks = _proc.start_ticks(pid)
    if ticks is None:
        raise CoordinatorError(f"the leader of job {job_id} (pid {pid}) vanished before StartJob")
    request = worker_pb2.StartJobRequest(
        fence=fence_to_proto(claim.fence),
        job_id=job_id,
        host=socket.gethostname(),
        pid=pid,
        start_ticks=ticks,
        argv=list(argv),
        log_ref=log_ref,
    )
    return claim.call(lambda worker: worker.StartJob, request)
