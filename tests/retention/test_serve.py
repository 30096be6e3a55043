"""Retention through a real ``coordinator serve``: the pruner thread runs, GetTask of a pruned
task is NOT_FOUND naming the archive, the id is refused, ``coordinator archive`` reads the
history back, and a replica SIGKILLed after the archive write but before the prune txn loses
nothing: the next one archives the task again and prunes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coordinator import lifeline
from coordinator.archive.local import LocalSink
from coordinator.cli import main
from coordinator.errors import AlreadyExists, NotFound
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import ClaimRefused, WorkerClient
from coordinator.store.retention.prune_turn import TURN_TTL
from tests.helpers import eventually

COMMAND = [sys.executable, "-c", "from coordinator.cli import main; main()"]
KILLED_AFTER_ARCHIVE = [
    sys.executable,
    "-c",
    "import tests.retention.killing_sink as k; k.install()\n"
    "from coordinator.cli import main; main()",
]
REPO = Path(__file__).resolve().parents[2]


@contextmanager
def serving(
    etcd: EtcdProcess, prefix: str, archive: Path, log: Path, command: list[str] = COMMAND
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A replica pruning after 1 s into ``archive``: (target, process)."""
    args = ["serve", "--etcd", etcd.endpoint, "--prefix", prefix, "--insecure"]
    args += ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    args += ["--retention", "1s", "--prune-interval", "0.2", "--archive", str(archive)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as stderr:
        process = subprocess.Popen([*command, *args], stderr=stderr, env=env, cwd=REPO)
        lifeline.kill_with_parent(process.pid)  # dies with this test run

    def listening() -> str | None:
        assert process.poll() is None, log.read_text()
        for line in log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "serving":
                return str(json.loads(line)["listen"])
        return None

    try:
        yield eventually(listening, timeout=30), process
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def served(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A replica pruning after 1 s into ``tmp_path/archive``: (target, archive dir)."""
    archive = tmp_path / "archive"
    with serving(etcd, prefix, archive, tmp_path / "serve.log") as (target, _):
        yield target, archive


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


def _finish(target: str, task_id: str) -> None:
    with WorkerClient(target, principal="pm-1") as client:
        client.create_task(task_id, input=b"hello")
        job = client.claim(task_id, ttl=timedelta(seconds=10))
        assert not isinstance(job, ClaimRefused)
        with job:
            job.commit(b"the result")


def test_a_replica_killed_between_archive_and_prune_archives_twice_and_loses_nothing(
    etcd: EtcdProcess, prefix: str, tmp_path: Path, etcd_client: Any
) -> None:
    archive = tmp_path / "archive"
    task_key = f"{prefix}/tasks/t1"
    with serving(etcd, prefix, archive, tmp_path / "doomed.log", KILLED_AFTER_ARCHIVE) as (
        target,
        doomed,
    ):
        _finish(target, "t1")
        eventually(lambda: doomed.poll() is not None, timeout=30, message="not killed")
        assert doomed.returncode == -signal.SIGKILL
    (first,) = [o for o in LocalSink(archive).read() if o["task_id"] == "t1"]
    value, _ = etcd_client.get(task_key)
    assert value is not None  # archived and fsynced, never pruned: the kill came between

    with (
        serving(etcd, prefix, archive, tmp_path / "survivor.log") as (target, _),
        WorkerClient(target, principal="pm-1") as client,
    ):

        def pruned() -> bool:
            try:
                client.get_task("t1")
            except NotFound:
                return True
            return False

        # The killed replica held the prune turn: it is free once its lease runs out.
        eventually(pruned, timeout=TURN_TTL + 20, message="t1 was not pruned after the restart")

    copies = [o for o in LocalSink(archive).read() if o["task_id"] == "t1"]
    assert len(copies) == 2  # archived twice ...
    second = copies[1]
    for section in ("task", "attempts", "events", "results", "staged", "effects", "jobs"):
        assert second[section] == first[section], section  # ... the same history, whole
    assert first["task"]["key"] == task_key and len(first["events"]) == 3
    left = sorted(m.key.decode() for _, m in etcd_client.get_prefix(prefix + "/"))
    assert [k for k in left if k.endswith("/t1")] == [
        k for k in left if "/tombstone" in k and k.endswith("/t1")
    ]  # nothing of t1 is left but its tombstone
