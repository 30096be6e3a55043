"""Retention through a real ``coordinator serve``: the pruner thread runs, GetTask of a pruned
task is NOT_FOUND naming the archive, the id is refused, and ``coordinator archive`` reads the
history back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from coordinator.cli import main
from coordinator.errors import AlreadyExists, NotFound
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused, WorkerClient
from tests.helpers import eventually

COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]


@pytest.fixture
def served(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A replica pruning after 1 s into ``tmp_path/archive``: (target, archive dir)."""
    archive, log = tmp_path / "archive", tmp_path / "serve.log"
    args = ["serve", "--etcd", etcd.endpoint, "--prefix", prefix, "--insecure"]
    args += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    args += ["--retention", "1s", "--prune-interval", "0.2", "--archive", str(archive)]
    with log.open("wb") as stderr:
        process = subprocess.Popen([*COMMAND, *args], stderr=stderr, env=dict(os.environ))

    def listening() -> str | None:
        assert process.poll() is None, log.read_text()
        for line in log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "serving":
                return str(json.loads(line)["listen"])
        return None

    try:
        yield eventually(listening, timeout=30), archive
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_finished_task_is_archived_then_gone_and_its_history_reads_back(
    served: tuple[str, Path],
) -> None:
    target, archive = served
    with WorkerClient(target, principal="pm-1") as client:
        client.create_task("t1", input=b"hello")
        job = client.claim("t1", ttl=timedelta(seconds=10))
        assert not isinstance(job, ClaimRefused)
        with job:
            job.commit(b"the result")

        def pruned() -> str | None:
            try:
                client.get_task("t1")
            except NotFound as gone:
                return str(gone)
            return None

        message = eventually(pruned, timeout=20, message="t1 was not pruned")
        assert "finished DONE and was archived" in message and str(archive) in message
        with pytest.raises(AlreadyExists):
            client.create_task("t1", input=b"again")

    runner = CliRunner()
    shown = runner.invoke(main, ["archive", "show", "t1", "--archive", str(archive)])
    assert shown.exit_code == 0, shown.output
    assert "task t1 queue default state DONE" in shown.output
    assert "COMMIT CLAIMED -> DONE by pm-1" in shown.output
    exported = runner.invoke(main, ["archive", "export", "--archive", str(archive)])
    assert exported.exit_code == 0, exported.output
    (line,) = [x for x in exported.stdout.splitlines() if x.startswith("{")]
    assert json.loads(line)["results"][0]["value"]["owner_id"] == "pm-1"
    missing = runner.invoke(main, ["archive", "show", "nope", "--archive", str(archive)])
    assert missing.exit_code == 1 and "not in the archive" in missing.output
