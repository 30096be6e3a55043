"""``coordinator tasks``: the pm's verbs against a real server and etcd, with exact outputs and
exit codes (0 done, 1 refused by the server, 2 bad options, nothing sent)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pty
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from structlog.testing import capture_logs

from coordinator.cli import main
from coordinator.cli.task_views import shown
from coordinator.domain.digests import digest_of
from coordinator.domain.failures import FailureReport
from coordinator.domain.retry import attempts_counted
from coordinator.domain.states import TaskState
from coordinator.domain.validation import MAX_INPUT_BYTES
from coordinator.store import Store, TaskSpec
from tests.helpers import eventually
from tests.lifecycle.support import RESULT, claim, create, finish, snapshot

Cli = Callable[..., Result]
# The module, not the ``tasks`` command that coordinator.cli exports under the same name.
tasks_cli = importlib.import_module("coordinator.cli.tasks")


@pytest.fixture
def cli(server: str) -> Cli:
    """Run ``coordinator tasks ARGS`` against the test's server (insecure: every role)."""

    def run(*args: str, input: bytes | str | None = None) -> Result:
        with capture_logs():  # the in-process server's log lines stay out of the output
            return CliRunner().invoke(
                main, ["tasks", *args, "--target", server, "--insecure"], input=input
            )

    return run


def _when(seconds: float) -> str:
    """A stored time as the tables print it."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


# --- create ------------------------------------------------------------------------------------


def test_create_prints_the_id_and_stores_every_option(store: Store, cli: Cli) -> None:
    create(store, "up")
    done = cli(
        "create",
        "--id",
        "report-1",
        "--queue",
        "reports",
        "--priority",
        "7",
        "--input",
        "write the report",
        "--depends-on",
        "up",
        "--requires-review",
        "--non-replayable",
    )
    assert (done.exit_code, done.stdout, done.stderr) == (0, "report-1\n", "")
    task = store.tasks.get("report-1")
    assert (task.queue, task.priority, task.input, task.state) == (
        "reports",
        7,
        b"write the report",
        TaskState.WAITING,
    )
    assert (task.depends_on, task.requires_review, task.non_replayable) == (("up",), True, True)


def test_create_sets_the_tasks_retry_policy_and_times(store: Store, cli: Cli) -> None:
    before = datetime.now(UTC).timestamp()
    made = cli(
        "create",
        "--id",
        "later",
        "--max-attempts",
        "0",
        "--initial-backoff",
        "0",
        "--backoff-multiplier",
        "3",
        "--max-backoff",
        "90",
        "--backoff-jitter",
        "0.5",
        "--non-retryable-errors",
        "bad-input, quota",
        "--not-before",
        "2h",
        "--schedule-to-close",
        "86400",
    )
    assert (made.exit_code, made.stdout) == (0, "later\n"), made.output
    task = store.tasks.get("later")
    policy = (task.max_attempts, task.initial_backoff, task.backoff_multiplier, task.max_backoff)
    assert policy == (0, 0.0, 3.0, 90.0)
    assert (task.backoff_jitter, task.non_retryable_errors) == (0.5, ("bad-input", "quota"))
    assert task.state is TaskState.DELAYED
    assert before + 7200 <= task.not_before <= datetime.now(UTC).timestamp() + 7200
    assert task.deadline == pytest.approx(task.created_at + 86400)

    fields = dict(line.split(None, 1) for line in cli("get", "later").stdout.splitlines() if line)
    assert fields["attempts_counted"] == "0 of unlimited"
    assert fields["retry_policy"] == (
        "backoff 0s x3 up to 90s, jitter 0.5; never retried: bad-input, quota"
    )
    assert fields["deadline"] == _when(task.deadline)
    assert fields["next_eligible"] == _when(task.not_before)

    plain = cli("create", "--id", "plain", "--input", "")  # no option: the server's defaults
    assert plain.exit_code == 0, plain.output
    defaults = store.tasks.get("plain")
    assert (defaults.max_attempts, defaults.deadline, defaults.non_retryable_errors) == (5, 0, ())
    shown = dict(line.split(None, 1) for line in cli("get", "plain").stdout.splitlines() if line)
    assert shown["retry_policy"] == (  # the test server's defaults: no wait
        f"backoff {defaults.initial_backoff:g}s x2 up to 300s, jitter {defaults.backoff_jitter:g}"
    )
    assert shown["deadline"] == "-"


def test_a_policy_the_server_refuses_exits_1_with_its_message(
    store: Store, cli: Cli, etcd_client: Any
) -> None:
    before = snapshot(store, etcd_client)
    refused = cli("create", "--input", "", "--initial-backoff", "60", "--max-backoff", "10")
    assert refused.exit_code == 1
    assert (
        "retry_policy.initial_backoff (60 s) must not exceed retry_policy.max_backoff (10 s)"
        in (refused.stderr)
    )
    assert snapshot(store, etcd_client) == before


def test_create_reads_the_input_from_stdin_or_a_file(
    store: Store, cli: Cli, tmp_path: Path
) -> None:
    piped = cli("create", "--input-file", "-", input=b"\x00binary\xff")
    assert piped.exit_code == 0, piped.output
    generated = piped.stdout.strip()
    assert store.tasks.get(generated).input == b"\x00binary\xff"
    spec = tmp_path / "spec.md"
    spec.write_bytes(b"# the spec\n")
    from_file = cli("create", "--id", "t-file", "--input-file", str(spec), "--json")
    assert from_file.exit_code == 0, from_file.output
    shown = json.loads(from_file.stdout)
    assert (shown["task_id"], shown["state"], shown["input"], shown["input_encoding"]) == (
        "t-file",
        "READY",
        "# the spec\n",
        "utf-8",
    )
    assert shown["input_digest"] == digest_of(b"# the spec\n")


def test_create_without_an_input_says_the_input_is_empty(store: Store, cli: Cli) -> None:
    made = cli("create", "--queue", "q", "--id", "bare")
    assert (made.exit_code, made.stdout) == (0, "bare\n")
    assert made.stderr == "note: no --input or --input-file: the task's input is empty\n"
    assert store.tasks.get("bare").input_digest == digest_of(b"")


def test_the_same_idempotency_key_creates_one_task(store: Store, cli: Cli) -> None:
    first = cli("create", "--input", "once", "--idempotency-key", "batch-7:item-1")
    again = cli("create", "--input", "once", "--idempotency-key", "batch-7:item-1")
    assert first.exit_code == again.exit_code == 0
    assert first.stdout == again.stdout
    tasks, _ = store.tasks.list(page_size=100)
    assert [t.task_id for t in tasks] == [first.stdout.strip()]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["create", "--priority", "1000"], "Invalid value for '--priority'"),
        (["create", "--id", "a b"], "Invalid value for '--id': task_id must be 1-128"),
        (["create", "--depends-on", ".."], "Invalid value for '--depends-on'"),
        (["create", "--queue", "a/b"], "Invalid value for '--queue'"),
        (["create", "--idempotency-key", "a b"], "Invalid value for '--idempotency-key'"),
        (["create", "--input", "x", "--input-file", "-"], "give --input or --input-file"),
        (["create", "--input-file", "/nonexistent/spec"], "Invalid value for '--input-file'"),
        (["create", "--max-attempts", "-1"], "Invalid value for '--max-attempts'"),
        (["create", "--backoff-multiplier", "0.5"], "Invalid value for '--backoff-multiplier'"),
        (["create", "--backoff-jitter", "2"], "Invalid value for '--backoff-jitter'"),
        (["create", "--schedule-to-close", "0"], "Invalid value for '--schedule-to-close'"),
        (["create", "--not-before", "tomorrow"], "'tomorrow' is neither an ISO 8601 time"),
        (["create", "--non-retryable-errors", ",".join("c" * 40)], "at most 32 codes, got 40"),
        (["list", "--limit", "0"], "Invalid value for '--limit'"),
        (["list", "--state", "DONEISH"], "Invalid value for '--state'"),
        (["get", "a b"], "Invalid value for 'TASK_ID'"),
        (["cancel", ""], "Invalid value for 'TASK_ID': task_id is required"),
        (["result", "t", "--revision", "-1"], "Invalid value for '--revision'"),
        (["result", "t", "--json", "--out", "-"], "--json carries the payload itself"),
        (["accept", "t"], "Missing option '--revision'"),
        (["reject", "t", "--revision", "1"], "Missing option '--reason'"),
        (["reject", "t", "--revision", "1", "--reason", " "], "Invalid value for '--reason'"),
        (["deps", "t", "--set", "a", "--clear"], "--set and --clear exclude each other"),
        (["deps", "t", "--expected-state-version", "3"], "goes with --set or --clear"),
    ],
)
def test_bad_options_exit_2_naming_the_option_and_change_nothing(
    store: Store, cli: Cli, etcd_client: Any, args: list[str], named: str
) -> None:
    create(store, "t")
    before = snapshot(store, etcd_client)
    refused = cli(*args)
    assert refused.exit_code == 2, refused.output
    assert named in refused.stderr
    assert refused.stdout == ""
    assert snapshot(store, etcd_client) == before


def test_an_input_over_the_limit_is_refused_before_sending(
    store: Store, cli: Cli, etcd_client: Any
) -> None:
    before = snapshot(store, etcd_client)
    refused = cli("create", "--input-file", "-", input=b"x" * (MAX_INPUT_BYTES + 1))
    assert refused.exit_code == 2
    assert (
        f"Invalid value for --input-file: the input is over the server's limit of "
        f"{MAX_INPUT_BYTES} bytes"
    ) in refused.stderr
    assert snapshot(store, etcd_client) == before


# --- list --------------------------------------------------------------------------------------


def _row(store: Store, task_id: str) -> list[str]:
    task = store.tasks.get(task_id)
    return [
        task.task_id,
        task.queue,
        task.state.name,
        str(task.revision),
        str(task.priority),
        f"{attempts_counted(task)}/{task.max_attempts or 'unlimited'}",
        task.owner_id if task.state is TaskState.CLAIMED else "-",
        _when(task.updated_at),
    ]


def test_list_filters_and_pages_up_to_the_limit(
    store: Store, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(5):
        create(store, f"a{n}", queue="q1")
    create(store, "b0", queue="q2", depends_on=("a0",))
    claim(store, "a1", "w1")
    monkeypatch.setattr(tasks_cli, "LIST_PAGE", 2)  # five tasks take three pages

    listed = cli("list", "--queue", "q1")
    assert (listed.exit_code, listed.stderr) == (0, "")
    lines = listed.stdout.splitlines()
    assert lines[0].split() == [
        "TASK",
        "QUEUE",
        "STATE",
        "REV",
        "PRIO",
        "ATTEMPTS",
        "OWNER",
        "UPDATED",
    ]
    assert [line.split() for line in lines[1:]] == [_row(store, f"a{n}") for n in range(5)]
    assert lines[2].split()[2:7] == ["CLAIMED", "1", "0", "1/5", "w1"]

    # Exactly --limit tasks match: no note. One more than --limit: the note says so.
    assert cli("list", "--queue", "q1", "--limit", "5").stderr == ""
    cut = cli("list", "--limit", "5")
    assert [line.split()[0] for line in cut.stdout.splitlines()[1:]] == [f"a{n}" for n in range(5)]
    assert cut.stderr == (
        "more tasks than --limit 5 (at most 10000): raise it or filter by --queue/--state\n"
    )
    # A filter already given is not suggested again.
    cut_queue = cli("list", "--queue", "q1", "--limit", "4")
    assert (
        cut_queue.stderr
        == "more tasks than --limit 4 (at most 10000): raise it or filter by --state\n"
    )

    waiting = cli("list", "--state", "waiting", "--json")
    assert waiting.exit_code == 0
    (line,) = waiting.stdout.splitlines()
    shown = json.loads(line)
    assert (shown["task_id"], shown["state"], shown["depends_on"]) == ("b0", "WAITING", ["a0"])
    assert "input" not in shown
    # An empty queue's list names the queues with work now (from the watch-fed indexes).
    hint = "no tasks in queue 'empty'; queues with ready or claimed tasks now: q1\n"
    eventually(lambda: cli("list", "--queue", "empty").stderr == hint, message="no hint")
    none = cli("list", "--queue", "empty")
    assert (none.exit_code, none.stdout, none.stderr) == (0, "", hint)
    # With a state, a queue that exists says so: no ready tasks in it, not "no tasks".
    done = cli("list", "--queue", "q1", "--state", "done")
    assert (done.exit_code, done.stderr) == (0, "no DONE tasks in queue 'q1'\n")
    assert cli("list", "--state", "review", "--blocked").stderr == "no blocked REVIEW tasks\n"
    assert cli("list", "--state", "cancelled").stderr == "no CANCELLED tasks\n"


def test_list_blocked_shows_a_dead_letters_dependents(store: Store, cli: Cli) -> None:
    """A dead letter's dependents stay WAITING, blocked: the CLI could only find them one task
    at a time (`tasks get`), though ListTasks filters them (``blocked``)."""
    create(store, "up")
    create(store, "down", depends_on=("up",))
    create(store, "other", depends_on=("down",))  # waits on a WAITING task: not blocked
    report = FailureReport(retryable=False, code="bad-row", message="row 7")
    store.failures.fail(claim(store, "up", "w1"), principal="w1", report=report)
    eventually(lambda: store.tasks.get("down").blocked_by == ("up",), message="not blocked")
    blocked = cli("list", "--blocked")
    assert [line.split()[:3] for line in blocked.stdout.splitlines()[1:]] == [
        ["down", "default", "WAITING(blocked)"]
    ]
    # The whole list marks it too; a task waiting on a WAITING one is not blocked.
    states = {line.split()[0]: line.split()[2] for line in cli("list").stdout.splitlines()[1:]}
    assert states == {"up": "FAILED", "down": "WAITING(blocked)", "other": "WAITING"}
    assert cli("list", "--overdue").stderr == "no overdue tasks\n"


# --- get ---------------------------------------------------------------------------------------


def _cycle(store: Store, task_id: str, times: int) -> None:
    """``times`` claims, each released: that many attempts."""
    for _ in range(times):
        fence = claim(store, task_id, "w1")
        store.acceptance.release(fence, principal="w1", reason="again")


def test_only_a_claimed_task_shows_an_owner_a_released_one_its_last(store: Store, cli: Cli) -> None:
    create(store, "held")
    create(store, "back")
    claim(store, "held", "w1")
    _cycle(store, "back", 1)  # claimed by w1, then released: READY, held by nobody
    rows = {line.split()[0]: line.split() for line in cli("list").stdout.splitlines()[1:]}
    assert (rows["held"][6], rows["back"][6]) == ("w1", "-")
    shown = dict(line.split(None, 1) for line in cli("get", "back").stdout.splitlines() if line)
    assert shown["owner"] == "- (the last attempt's: w1)"


def test_get_shows_the_task_and_its_latest_attempts(
    store: Store, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unlimited attempts: 22 releases would dead-letter a task under the default policy (5).
    spec = TaskSpec(task_id="t", input=b"input of t", retry=(("max_attempts", 0),))
    store.tasks.create(spec, by="pm")
    _cycle(store, "t", 22)
    task = store.tasks.get("t")
    shown = cli("get", "t")
    assert (shown.exit_code, shown.stderr) == (0, "")
    head, attempts = shown.stdout.split("\n\n")
    fields = dict(line.split(None, 1) for line in head.splitlines() if " / " not in line)
    assert fields["task"] == "t"
    assert fields["state"] == "READY"
    assert fields["input"] == "'input of t'"
    assert fields["attempt"] == f"22 {task.attempt_id}"
    lines = attempts.splitlines()
    assert lines[0] == "attempts: 22 (the latest 20; --attempts lists every one)"
    assert lines[1].split() == [
        "#",
        "ATTEMPT",
        "OWNER",
        "GEN",
        "EPOCH",
        "STARTED",
        "ENDED",
        "END",
        "CHECKPOINT",
    ]
    assert [line.split()[0] for line in lines[2:]] == [str(n) for n in range(3, 23)]
    assert all(line.split()[-2:] == ["RELEASED", "-"] for line in lines[2:])
    assert fields["checkpoint"] == "-"

    monkeypatch.setattr(tasks_cli, "ATTEMPTS_PAGE", 5)  # 22 attempts: five pages
    every = cli("get", "t", "--attempts").stdout.split("\n\n")[1].splitlines()
    assert every[0] == "attempts: 22"
    numbers = [line.split()[0] for line in every[1:] if line.split()[0] != "#"]
    assert numbers == [str(n) for n in range(1, 23)]

    as_json = json.loads(cli("get", "t", "--json").stdout)
    assert (as_json["task"]["task_id"], as_json["task"]["state"]) == ("t", "READY")
    assert as_json["attempt_count"] == 22
    assert [a["attempt"] for a in as_json["attempts"]] == list(range(3, 23))
    all_json = json.loads(cli("get", "t", "--json", "--attempts").stdout)
    assert [a["attempt"] for a in all_json["attempts"]] == list(range(1, 23))
    assert {a["end"] for a in all_json["attempts"]} == {"RELEASED"}


def test_get_shows_why_a_task_failed(store: Store, cli: Cli) -> None:
    # The text view once said FAILED and nothing more: the cause was only in --json or events.
    store.tasks.create(TaskSpec(task_id="t", input=b""), by="pm")
    report = FailureReport(retryable=False, code="empty-input", message="nothing to say")
    store.failures.fail(claim(store, "t", "w1"), principal="w1", report=report)
    head, attempts = cli("get", "t").stdout.split("\n\n")
    fields = dict(line.split(None, 1) for line in head.splitlines() if " / " not in line)
    # Each attempt's END names the code it failed with (a shutdown give-back: WorkerShutdown).
    assert attempts.splitlines()[2].split()[-2] == "FAILED:empty-input"
    assert fields["state"] == "FAILED"
    assert fields["dead_letter"] == "NON_RETRYABLE"
    assert fields["last_error"] == store.tasks.get("t").last_error
    assert fields["last_error"].startswith("empty-input")
    assert fields["attempts_counted"] == "1 of 5"
    assert (fields["next_eligible"], fields["blocked_by"]) == ("-", "-")


def test_get_shows_the_size_of_the_checkpoint_a_next_attempt_resumes_from(
    store: Store, cli: Cli
) -> None:
    store.tasks.create(TaskSpec(task_id="t", input=b"in"), by="pm")
    fence = claim(store, "t", "w1")
    store.renewals.renew(fence, principal="w1", progress="p", checkpoint=b"rows 0-9")
    store.acceptance.release(fence, principal="w1", reason="again")
    second = claim(store, "t", "w2")  # handed the checkpoint, has written none of its own
    head, attempts = cli("get", "t").stdout.split("\n\n")
    fields = dict(line.split(None, 1) for line in head.splitlines() if " / " not in line)
    assert fields["checkpoint"] == "8 bytes"
    rows = [line.split() for line in attempts.splitlines()[2:]]
    assert [(row[0], row[-3], row[-2:]) for row in rows] == [
        ("1", "RELEASED", ["8", "bytes"]),
        ("2", "RUNNING", ["8", "bytes"]),
    ]
    as_json = json.loads(cli("get", "t", "--json").stdout)
    assert as_json["task"]["checkpoint_size"] == 8
    assert [a["checkpoint_size"] for a in as_json["attempts"]] == [8, 8]
    listed = json.loads(cli("list", "--json").stdout.splitlines()[0])
    assert listed["checkpoint_size"] is None  # a list reads no attempt: not known, not 0
    # The latest attempt's own checkpoint is the one a next attempt resumes from.
    store.renewals.renew(second, principal="w2", progress="p", checkpoint=b"rows 0-999")
    as_json = json.loads(cli("get", "t", "--json").stdout)
    assert as_json["task"]["checkpoint_size"] == 10
    assert [a["checkpoint_size"] for a in as_json["attempts"]] == [8, 10]


def test_get_of_an_unknown_task_exits_1_with_the_servers_message(cli: Cli) -> None:
    missing = cli("get", "nope")
    assert (missing.exit_code, missing.stdout) == (1, "")
    assert missing.stderr == "Error: NOT_FOUND: task 'nope' does not exist\n"


# --- result ------------------------------------------------------------------------------------


def test_result_prints_the_payload_and_what_committed_it(
    store: Store, cli: Cli, tmp_path: Path
) -> None:
    create(store, "t", review=True)
    fence = claim(store, "t", "w1")
    store.acceptance.commit(
        fence,
        principal="w1",
        input_digest=store.tasks.get("t").input_digest,
        result_digest=digest_of(RESULT),
        result=RESULT,
        result_ref="",
        evidence=("job-1",),
    )
    shown = cli("result", "t")
    assert (shown.exit_code, shown.stdout) == (0, "the report")
    committed = store.tasks.get("t").updated_at
    assert shown.stderr.splitlines() == [
        "task                t revision 1",
        f"commit              {fence.attempt_id}@{fence.claim_generation}",
        f"attempt             {fence.attempt_id} by w1",
        f"generation / epoch  {fence.claim_generation} / 1",
        f"committed           {_when(committed)}",
        f"digest              {digest_of(RESULT)}",
        "size                10 bytes",
        "ref                 -",
        "evidence            job-1",
    ]
    out = tmp_path / "result.txt"
    written = cli("result", "t", "--revision", "1", "--out", str(out))
    assert (written.exit_code, written.stdout) == (0, "")
    assert written.stderr.endswith(f"wrote 10 bytes to {out}\n")
    assert out.read_bytes() == RESULT
    as_json = json.loads(cli("result", "t", "--json").stdout)
    assert as_json == {
        "task_id": "t",
        "revision": 1,
        "result": "the report",
        "result_encoding": "utf-8",
        "result_ref": "",
        "result_digest": digest_of(RESULT),
        "attempt_id": fence.attempt_id,
        "claim_generation": fence.claim_generation,
        "scheduler_epoch": 1,
        "commit_id": f"{fence.attempt_id}@{fence.claim_generation}",
        "owner_id": "w1",
        "committed_at": as_json["committed_at"],
        "evidence": ["job-1"],
    }


def _on_a_terminal(args: list[str]) -> bytes:
    """What the CLI writes to stdout when stdout is a terminal (a pty; its \\n comes out \\r\\n)."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from coordinator.cli import main; main()", *args],
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
        os.close(follower)
        assert done.returncode == 0, done.stderr
        chunks = []
        with contextlib.suppress(OSError):  # EIO once everything written was read
            while chunk := os.read(leader, 4096):
                chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(leader)


def test_result_on_a_terminal_ends_its_line(store: Store, server: str) -> None:
    create(store, "t")
    finish(store, "t", "w1")  # commits RESULT, which has no final newline
    assert not RESULT.endswith(b"\n")
    shown = _on_a_terminal(["tasks", "result", "t", "--target", server, "--insecure"])
    assert shown == RESULT + b"\r\n"  # the prompt starts on a line of its own


def test_a_binary_result_needs_out(store: Store, cli: Cli, tmp_path: Path) -> None:
    create(store, "t")
    fence = claim(store, "t", "w1")
    payload = b"\x89PNG\x00\xff"
    store.acceptance.commit(
        fence,
        principal="w1",
        input_digest=store.tasks.get("t").input_digest,
        result_digest=digest_of(payload),
        result=payload,
        result_ref="",
    )
    refused = cli("result", "t")
    assert (refused.exit_code, refused.stdout) == (2, "")
    assert (
        "the result of t revision 1 is 6 bytes of binary data: write it to a file with --out FILE"
    ) in refused.stderr
    out = tmp_path / "r.png"
    assert cli("result", "t", "--out", str(out)).exit_code == 0
    assert out.read_bytes() == payload
    as_json = json.loads(cli("result", "t", "--json").stdout)
    assert (as_json["result"], as_json["result_encoding"]) == ("iVBORwD/", "base64")


def test_a_revision_without_a_result_exits_1_naming_the_ones_with_one(
    store: Store, cli: Cli
) -> None:
    create(store, "t", review=True)
    finish(store, "t", "w1")
    store.review.reject("t", revision=1, reviewer="pm", reason="no tests")
    missing = cli("result", "t")
    assert (missing.exit_code, missing.stdout) == (1, "")
    assert missing.stderr == (
        "Error: NOT_FOUND: task 't' has no committed result for revision 2 "
        "(revisions with one, latest first: 1); the task is READY\n"
    )
    assert cli("result", "t", "--revision", "1").stdout == "the report"


# --- cancel / accept / reject / deps ------------------------------------------------------------


def test_review_and_cancel_print_the_new_state(store: Store, cli: Cli) -> None:
    create(store, "t", review=True)
    finish(store, "t", "w1")
    rejected = cli("reject", "t", "--revision", "1", "--reason", "no tests")
    assert (rejected.exit_code, rejected.stdout) == (
        0,
        "t READY at revision 2: rejected revision 1\n",
    )
    finish(store, "t", "w2")
    stale = cli("accept", "t", "--revision", "1")
    assert (stale.exit_code, stale.stdout) == (1, "")
    assert "the task is at revision 2" in stale.stderr
    accepted = cli("accept", "t", "--revision", "2", "--json")
    assert accepted.exit_code == 0
    assert (json.loads(accepted.stdout)["state"], store.tasks.get("t").state) == (
        "DONE",
        TaskState.DONE,
    )
    create(store, "u")
    cancelled = cli("cancel", "u", "--reason", "not needed")
    assert (cancelled.exit_code, cancelled.stdout) == (0, "u CANCELLED (cancel_generation 1)\n")
    assert store.tasks.get("u").state is TaskState.CANCELLED
    again = cli("cancel", "t")
    assert (again.exit_code, again.stderr) == (
        1,
        "Error: FAILED_PRECONDITION: task 't' is DONE; it cannot be cancelled\n",
    )
    create(store, "v")
    create(store, "w", depends_on=("v",))
    cascaded = cli("cancel", "v", "--cascade")
    assert (cascaded.exit_code, cascaded.stdout) == (
        0,
        "v CANCELLED (cancel_generation 1)\ncancelled below it: w\n",
    )
    assert store.tasks.get("w").state is TaskState.CANCELLED


def test_deps_shows_and_sets_upstreams(store: Store, cli: Cli) -> None:
    create(store, "a")
    create(store, "b")
    finish(store, "b", "w1")
    create(store, "t", depends_on=("a", "b"))
    shown = cli("deps", "t")
    assert (shown.exit_code, shown.stdout) == (
        0,
        "t WAITING\nUPSTREAM  STATE\na         READY\nb         DONE\n",
    )
    version = store.tasks.get("t").state_version
    stale = cli("deps", "t", "--set", "b", "--expected-state-version", str(version + 1))
    assert stale.exit_code == 1
    assert store.tasks.get("t").depends_on == ("a", "b")
    moved = cli("deps", "t", "--set", "b", "--expected-state-version", str(version))
    assert (moved.exit_code, moved.stdout) == (0, "t READY\nUPSTREAM  STATE\nb         DONE\n")
    cleared = cli("deps", "t", "--clear", "--json")
    assert json.loads(cleared.stdout) == {"task_id": "t", "state": "READY", "depends_on": []}
    assert cli("deps", "t").stdout == "t READY\nno upstreams\n"
    assert cli("deps", "a", "--set", "t").stdout == "a WAITING\nUPSTREAM  STATE\nt         READY\n"
    looped = cli("deps", "t", "--set", "a")
    assert looped.exit_code == 1
    assert looped.stderr == "Error: FAILED_PRECONDITION: dependency cycle refused: t -> a -> t\n"


def test_control_characters_a_caller_sent_are_shown_escaped_never_sent_to_the_terminal(
    store: Store, cli: Cli
) -> None:
    create(store, "t", queue="q")
    hostile = "bye\x1b]0;owned\x07\x1b[2J\x9b"
    report = FailureReport(retryable=False, code="Bad", message=hostile)
    store.failures.fail(claim(store, "t"), principal="w1", report=report)
    shown = cli("get", "t")
    assert shown.exit_code == 0
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout and "\x9b" not in shown.stdout
    assert "bye\\x1b]0;owned\\x07\\x1b[2J\\x9b" in shown.stdout


def test_shown_escapes_control_characters_but_tabs_and_bidirectional_overrides() -> None:
    # A line break a worker put in an error message printed a fake line of `coordinator
    # events`; a right-to-left override reversed the rest of the line on the operator's screen.
    assert shown("a\x1bb\tc\nd\x9be\x7f\x00\r") == "a\\x1bb\tc\\x0ad\\x9be\\x7f\\x00\\x0d"
    assert shown("ok \u202edab\u2066 \u00e9\u4e2d") == "ok \\u202edab\\u2066 \u00e9\u4e2d"
    # Line and paragraph separators (a terminal table printed them as line breaks: forged
    # field lines), zero-width and byte-order characters; accents, CJK and emoji stay.
    forged = "disk full\u2028owner  adm\u2029\u200b\ufeff e\u0301 \U0001f600"
    assert shown(forged) == "disk full\\u2028owner  adm\\u2029\\u200b\\ufeff e\u0301 \U0001f600"
