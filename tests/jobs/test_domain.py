"""coordinator.domain.jobs: the record's legal changes, FinishJob's and rediscover's decisions,
and the request checks (pure, no etcd)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.domain.jobs import (
    JOB_TRANSITIONS,
    MAX_ARGV,
    MAX_EVIDENCE,
    TERMINAL_JOB_STATES,
    FinishVerdict,
    JobRecord,
    JobState,
    RediscoverAction,
    can_change,
    check_argv,
    check_evidence,
    check_finish_state,
    check_host,
    check_job_id,
    check_log_ref,
    decide_finish,
    decide_rediscover,
    same_start,
)
from coordinator.domain.records import decode, encode
from coordinator.errors import InvalidArgument
from coordinator.v1 import worker_pb2

RECORD = JobRecord(
    job_id="j-1",
    task_id="t-1",
    attempt_id="a1-abc",
    claim_generation=42,
    scheduler_epoch=1,
    cancel_generation=0,
    worker_id="w1",
    host="box",
    pid=1234,
    start_ticks=99,
    argv=("make", "test"),
    log_ref="/tmp/j-1.log",
    started_at=10.0,
)


def test_job_state_values_equal_the_wire() -> None:
    wire = {n.removeprefix("JOB_STATE_"): v for n, v in worker_pb2.JobState.items()}
    assert wire.pop("UNSPECIFIED") == 0
    assert {s.name: s.value for s in JobState} == wire


def test_only_a_running_job_may_change_and_only_to_an_end() -> None:
    allowed = {(a, b) for a, b in itertools.product(JobState, JobState) if can_change(a, b)}
    assert allowed == {(JobState.RUNNING, end) for end in TERMINAL_JOB_STATES}
    assert set(JOB_TRANSITIONS) == set(JobState)
    assert {JobState.EXITED, JobState.KILLED, JobState.LOST} == TERMINAL_JOB_STATES


@pytest.mark.parametrize("before", list(JobState))
@pytest.mark.parametrize("reported", sorted(TERMINAL_JOB_STATES))
def test_finish_records_only_the_first_end(before: JobState, reported: JobState) -> None:
    record = JobRecord(**{**RECORD.__dict__, "state": before})
    expected = FinishVerdict.RECORD if before is JobState.RUNNING else FinishVerdict.ALREADY_FINAL
    assert decide_finish(record, reported) is expected


def test_finish_refuses_running_as_an_end() -> None:
    with pytest.raises(InvalidArgument, match="EXITED, KILLED or LOST"):
        decide_finish(RECORD, JobState.RUNNING)


BOOLS = (True, False)


# Every combination of the inputs, with the one action each must produce.
@pytest.mark.parametrize(
    ("state", "local", "current", "matches", "code", "action"),
    [
        # Terminal records are reported, whatever else holds.
        *[
            (s, local, cur, m, c, RediscoverAction.REPORT)
            for s in sorted(TERMINAL_JOB_STATES)
            for local, cur, m, c in itertools.product(BOOLS, BOOLS, BOOLS, [None, 0])
        ],
        # A running record of another host is left alone: its pid means nothing here.
        *[
            (JobState.RUNNING, False, cur, m, c, RediscoverAction.ELSEWHERE)
            for cur, m, c in itertools.product(BOOLS, BOOLS, [None, 0])
        ],
        (JobState.RUNNING, True, True, True, None, RediscoverAction.REATTACH),
        (JobState.RUNNING, True, True, True, 3, RediscoverAction.REATTACH),
        (JobState.RUNNING, True, False, True, None, RediscoverAction.KILL),
        (JobState.RUNNING, True, False, True, 3, RediscoverAction.KILL),
        (JobState.RUNNING, True, True, False, 3, RediscoverAction.RECORD_EXIT),
        (JobState.RUNNING, True, False, False, 0, RediscoverAction.RECORD_EXIT),
        (JobState.RUNNING, True, True, False, None, RediscoverAction.MARK_LOST),
        (JobState.RUNNING, True, False, False, None, RediscoverAction.MARK_LOST),
    ],
)
def test_rediscover_decisions(
    state: JobState,
    local: bool,
    current: bool,
    matches: bool,
    code: int | None,
    action: RediscoverAction,
) -> None:
    record = JobRecord(**{**RECORD.__dict__, "state": state})
    got = decide_rediscover(
        record,
        current=current,
        on_this_host=local,
        process_matches=matches,
        exit_code=code,
    )
    assert got is action


@given(current=st.booleans(), code=st.none() | st.integers(-64, 255))
def test_a_process_that_does_not_match_is_never_killed(current: bool, code: int | None) -> None:
    """A pid that is absent or started at another time (a reused pid) is never KILL."""
    action = decide_rediscover(
        RECORD, current=current, on_this_host=True, process_matches=False, exit_code=code
    )
    assert action is not RediscoverAction.KILL and action is not RediscoverAction.REATTACH


def test_same_start_names_a_retry_only() -> None:
    retry = JobRecord(**{**RECORD.__dict__, "started_at": 99.0})
    assert same_start(RECORD, retry)
    for change in ({"pid": 1235}, {"start_ticks": 100}, {"argv": ("make",)}, {"host": "other"}):
        assert not same_start(RECORD, JobRecord(**{**RECORD.__dict__, **change}))


def test_record_round_trips_as_json_without_its_revision() -> None:
    stored = JobRecord(**{**RECORD.__dict__, "mod_revision": 7})
    back = decode(JobRecord, encode(stored), mod_revision=8)
    assert back == RECORD and back.mod_revision == 8
    assert b"mod_revision" not in encode(stored)


@pytest.mark.parametrize(
    ("check", "value", "field"),
    [
        (check_job_id, "", "job_id is required"),
        (check_job_id, "a/b", "job_id must be"),
        (check_job_id, "x" * 65, "job_id must be"),
        (check_argv, [], "argv is required"),
        (check_argv, [""], "argv\\[0\\]"),
        (check_argv, ["x"] * (MAX_ARGV + 1), "argv has"),
        (check_argv, ["x" * 20000], "argv is 20000 characters"),
        (check_host, "", "host is required"),
        (check_host, "h" * 256, "host is 256"),
        (check_log_ref, "", "log_ref is required"),
        (check_evidence, [""], "evidence\\[0\\] is empty"),
        (check_evidence, ["e"] * (MAX_EVIDENCE + 1), "evidence has"),
        (check_finish_state, 0, "state is required"),
        (check_finish_state, 1, "JOB_STATE_RUNNING"),
        (check_finish_state, 9, "not a known JobState"),
    ],
)
def test_bad_input_names_the_field(check: object, value: object, field: str) -> None:
    with pytest.raises(InvalidArgument, match=field):
        check(value)  # type: ignore[operator]


def test_good_input_passes_unchanged() -> None:
    assert check_job_id("j-0123abcd") == "j-0123abcd"
    assert check_argv(["sh", "-c", "true"]) == ("sh", "-c", "true")
    assert check_evidence(["j-1", "/tmp/j-1.log"]) == ("j-1", "/tmp/j-1.log")
    assert check_finish_state(int(JobState.KILLED)) is JobState.KILLED
