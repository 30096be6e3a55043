"""Who may read a committed result (GetResult): pm and admin, not a worker; over a real channel
with bearer tokens, through the SDK and the CLI."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from structlog.testing import capture_logs

from coordinator.cli import main
from coordinator.errors import PermissionDenied
from coordinator.sdk import CallRetry, Claim, WorkerClient
from tests.auth.conftest import TokenRing
from tests.conftest import GRPC_OPTIONS


def _client(ring: TokenRing, target: str, principal: str) -> WorkerClient:
    return WorkerClient(
        target,
        principal=principal,
        token=ring.tokens[principal],
        channel_options=GRPC_OPTIONS,
        retry=CallRetry(attempts=1),
    )


@pytest.fixture
def committed(ring: TokenRing, secured: str) -> str:
    """Task t-1, created by pm-1 and committed by worker-a; returns its result commit id."""
    with _client(ring, secured, "pm-1") as pm, _client(ring, secured, "worker-a") as worker:
        pm.create_task("t-1", input=b"input", requires_review=True)
        claim = worker.claim("t-1", ttl=timedelta(seconds=30))
        assert isinstance(claim, Claim), claim
        outcome = claim.commit(b"the report")
        assert outcome.committed
        return outcome.result_commit_id


def test_pm_and_admin_read_the_result_a_worker_may_not(
    ring: TokenRing, secured: str, committed: str
) -> None:
    for reader in ("pm-1", "admin-1"):
        with _client(ring, secured, reader) as client:
            got = client.get_result("t-1")
        assert (got.commit_id, got.result, got.owner_id) == (committed, b"the report", "worker-a")
    with _client(ring, secured, "worker-a") as worker, pytest.raises(PermissionDenied) as info:
        worker.get_result("t-1")
    assert str(info.value) == (
        "PERMISSION_DENIED: principal 'worker-a' (roles: worker) may not call "
        "/coordinator.v1.TaskService/GetResult; allowed roles: admin,pm"
    )


def test_the_cli_sends_the_token_and_reports_the_refusal(
    ring: TokenRing, secured: str, committed: str
) -> None:
    def run(principal: str) -> tuple[int, str, str]:
        env = {"COORDINATOR_TOKEN": ring.tokens[principal], "COORDINATOR_TARGET": secured}
        with capture_logs():  # the server's log lines stay out of the command's output
            result = CliRunner().invoke(main, ["tasks", "result", "t-1"], env=env)
        return result.exit_code, result.stdout, result.stderr

    code, out, err = run("pm-1")
    assert (code, out) == (0, "the report")
    assert f"commit              {committed}\n" in err
    code, out, err = run("worker-a")
    assert (code, out) == (1, "")
    assert err == (
        "Error: PERMISSION_DENIED: principal 'worker-a' (roles: worker) may not call "
        "/coordinator.v1.TaskService/GetResult; allowed roles: admin,pm\n"
    )


def test_the_cli_reads_the_token_from_the_file_coordinator_token_file_names(
    ring: TokenRing, secured: str, committed: str, tmp_path: Path
) -> None:
    """The chart mounts a token as a file and names it, never putting it in the environment."""
    token_file = tmp_path / "token"
    token_file.write_text(ring.tokens["pm-1"] + "\n")
    env = {"COORDINATOR_CLIENT_TOKEN_FILE": str(token_file), "COORDINATOR_TARGET": secured}
    with capture_logs():
        result = CliRunner().invoke(main, ["tasks", "result", "t-1"], env=env)
    assert (result.exit_code, result.stdout) == (0, "the report")
    assert f"commit              {committed}\n" in result.stderr
    # A token given directly wins over the file (here: a worker's, refused).
    env["COORDINATOR_TOKEN"] = ring.tokens["worker-a"]
    with capture_logs():
        result = CliRunner().invoke(main, ["tasks", "result", "t-1"], env=env)
    assert result.exit_code == 1
    assert "principal 'worker-a'" in result.stderr
