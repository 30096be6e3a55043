"""Managed jobs: external commands bound to a task's attempt and claim (pure, no I/O).

A job record under ``{p}/jobs/{task_id}/{job_id}`` is the authority on one command a worker
runs for an attempt (seed 004: a managed command has its own execution lifecycle, and its
record, not the memory of the worker that started it, says what became of it). The rules here:

* which state changes a record allows (``JOB_TRANSITIONS``): RUNNING ends once, as EXITED,
  KILLED or LOST; a terminal record never changes again (``decide_finish``);
* what a restarted worker does with each of its records (``decide_rediscover``): re-attach a
  running job of a still-current attempt, kill one of a superseded attempt (only if its pid and
  process start time still match: never a reused pid), record the exit of one that ended while
  nobody watched, mark LOST one whose process is gone without a trace, report the terminal ones;
* request checks for the job RPCs (raise InvalidArgument naming the field).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from coordinator.domain import validation
from coordinator.errors import InvalidArgument

MAX_ARGV = 256
MAX_ARGV_CHARS = 16 * 1024
MAX_HOST_CHARS = 255
MAX_EVIDENCE = 64

_JOB_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class JobState(IntEnum):
    """Where a managed job stands; values equal the wire's JobState."""

    RUNNING = 1
    # The command ended by itself; exit_code is its status (negative: killed by that signal).
    EXITED = 2
    # The SDK (or rediscover) terminated its process group: the claim was lost, or on request.
    KILLED = 3
    # The process is gone and nobody saw how it ended (a worker died with it).
    LOST = 4


TERMINAL_JOB_STATES = frozenset({JobState.EXITED, JobState.KILLED, JobState.LOST})

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.RUNNING: TERMINAL_JOB_STATES,
    JobState.EXITED: frozenset(),
    JobState.KILLED: frozenset(),
    JobState.LOST: frozenset(),
}
"""Every legal record change: a running job ends once; an ended one is evidence, kept as is."""


@dataclass(frozen=True)
class JobRecord:
    """One managed job under {p}/jobs/{task_id}/{job_id}."""

    job_id: str
    task_id: str
    attempt_id: str
    claim_generation: int
    scheduler_epoch: int
    cancel_generation: int
    # The principal that started it: the only one that may finish it.
    worker_id: str
    host: str
    # The process group leader (the group id is the same number: started in its own session).
    pid: int
    # Field 22 of /proc/<pid>/stat (clock ticks since boot): with pid, names one process ever.
    start_ticks: int
    argv: tuple[str, ...]
    # Where the job's output is captured (a file path on ``host``); commits cite it as evidence.
    log_ref: str
    state: JobState = JobState.RUNNING
    exit_code: int = 0
    detail: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    # etcd mod_revision of the job key (FinishJob's CAS); attached on decode, never stored.
    mod_revision: int = field(default=0, compare=False)

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (its record never changes again)."""
        return self.state in TERMINAL_JOB_STATES


@dataclass(frozen=True)
class JobStatus:
    """A job record and whether its attempt still holds the claim (ListJobs compares the
    job's fence with the claim key, the task key and the epoch, server-side)."""

    job: JobRecord
    current: bool


def can_change(before: JobState, after: JobState) -> bool:
    """Whether a record in ``before`` may be rewritten to ``after``."""
    return after in JOB_TRANSITIONS[before]


def same_start(existing: JobRecord, requested: JobRecord) -> bool:
    """Whether ``requested`` is a retry of the StartJob that wrote ``existing``."""
    return (
        existing.task_id,
        existing.attempt_id,
        existing.claim_generation,
        existing.worker_id,
        existing.host,
        existing.pid,
        existing.start_ticks,
        existing.argv,
        existing.log_ref,
    ) == (
        requested.task_id,
        requested.attempt_id,
        requested.claim_generation,
        requested.worker_id,
        requested.host,
        requested.pid,
        requested.start_ticks,
        requested.argv,
        requested.log_ref,
    )


class FinishVerdict(Enum):
    """What FinishJob does with a record."""

    RECORD = "record"  # RUNNING -> the reported end
    ALREADY_FINAL = "already_final"  # terminal: kept as it is, whatever the report says


def decide_finish(record: JobRecord, state: JobState) -> FinishVerdict:
    """Whether reporting ``state`` for ``record`` writes anything. Never rewrites an end."""
    if state not in TERMINAL_JOB_STATES:
        raise InvalidArgument(f"state must be EXITED, KILLED or LOST, got {state.name}")
    if can_change(record.state, state):
        return FinishVerdict.RECORD
    return FinishVerdict.ALREADY_FINAL


class RediscoverAction(Enum):
    """What a restarted worker does with one of its job records."""

    REATTACH = "reattach"  # running, its attempt still holds the claim: watch it again
    KILL = "kill"  # running, its attempt was superseded: terminate its group, record KILLED
    RECORD_EXIT = "record_exit"  # its process ended and left its exit status: record EXITED
    MARK_LOST = "mark_lost"  # its process is gone without a trace: record LOST
    REPORT = "report"  # terminal already: report the recorded outcome
    ELSEWHERE = "elsewhere"  # running on another host: its pid means nothing here; left alone


def decide_rediscover(
    record: JobRecord,
    *,
    current: bool,
    on_this_host: bool,
    process_matches: bool,
    exit_code: int | None,
) -> RediscoverAction:
    """The action for one record after a restart.

    ``on_this_host``: the record's host is the one looking (pids are per host). ``current``:
    the job's attempt still holds the claim (the server compared the claim key's generation).
    ``process_matches``: a live process has the record's pid AND start time; a pid that is
    absent or started at another time is not this job's (a reused pid is never killed).
    ``exit_code``: the status the job left behind when it ended by itself, if any.
    """
    if record.terminal:
        return RediscoverAction.REPORT
    if not on_this_host:
        return RediscoverAction.ELSEWHERE
    if process_matches:
        return RediscoverAction.REATTACH if current else RediscoverAction.KILL
    if exit_code is not None:
        return RediscoverAction.RECORD_EXIT
    return RediscoverAction.MARK_LOST


# --- request checks -------------------------------------------------------------------------


def check_job_id(value: str, field_name: str = "job_id") -> str:
    """A job id: 1-64 characters of [A-Za-z0-9._-], not ``.`` or ``..`` (chosen by the SDK,
    unique per job)."""
    if not value:
        raise InvalidArgument(f"{field_name} is required")
    if not _JOB_ID.fullmatch(value):
        raise InvalidArgument(
            f"{field_name} must be 1-64 characters of [A-Za-z0-9._-], got {value[:80]!r}"
        )
    return validation.no_dot_segments(field_name, value)


def check_argv(argv: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The command line: 1-256 arguments, the first non-empty, 16 KiB in all."""
    if not argv:
        raise InvalidArgument("argv is required (the command and its arguments)")
    if len(argv) > MAX_ARGV:
        raise InvalidArgument(f"argv has {len(argv)} arguments, the limit is {MAX_ARGV}")
    if not argv[0]:
        raise InvalidArgument("argv[0] (the command) must not be empty")
    total = sum(len(a) for a in argv)
    if total > MAX_ARGV_CHARS:
        raise InvalidArgument(f"argv is {total} characters, the limit is {MAX_ARGV_CHARS}")
    return tuple(argv)


def check_host(value: str) -> str:
    """The host the job runs on (required: pids mean nothing without it)."""
    if not value:
        raise InvalidArgument("host is required")
    return validation.text("host", value, MAX_HOST_CHARS)


def check_log_ref(value: str) -> str:
    """Where the output is captured (required: it is the job's evidence)."""
    if not value:
        raise InvalidArgument("log_ref is required")
    return validation.text("log_ref", value, validation.MAX_REF_CHARS)


def check_evidence(values: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """A commit's evidence: up to 64 non-empty references (job ids, log refs)."""
    if len(values) > MAX_EVIDENCE:
        raise InvalidArgument(f"evidence has {len(values)} entries, the limit is {MAX_EVIDENCE}")
    for i, value in enumerate(values):
        if not value:
            raise InvalidArgument(f"evidence[{i}] is empty")
        validation.text(f"evidence[{i}]", value, validation.MAX_REF_CHARS)
    return tuple(values)


def check_finish_state(value: int) -> JobState:
    """FinishJob's state: EXITED, KILLED or LOST."""
    if value == 0:
        raise InvalidArgument("state is required (EXITED, KILLED or LOST)")
    try:
        state = JobState(value)
    except ValueError:
        raise InvalidArgument(f"state {value} is not a known JobState") from None
    if state not in TERMINAL_JOB_STATES:
        raise InvalidArgument(
            "state must be JOB_STATE_EXITED, JOB_STATE_KILLED or JOB_STATE_LOST, "
            f"got JOB_STATE_{state.name} (RUNNING is written only by StartJob)"
        )
    return state
