"""``coordinator jobs`` lists a worker's job records from the coordinator."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from coordinator.cli import main
from coordinator.etcd_process import EtcdProcess
from coordinator.sdk import Claim, JobState
from tests.sdk.support import QUEUE, served


def test_jobs_lists_the_records_of_a_worker(etcd: EtcdProcess, prefix: str, tmp_path: Path) -> None:
    with served(etcd.endpoint, prefix) as running, running.client("w1") as w1:
        w1.create_task("t1", input=b"in", queue=QUEUE)
        job = w1.claim("t1", ttl=timedelta(seconds=30))
        assert isinstance(job, Claim)
        with job:
            proc = job.run(["sh", "-c", "exit 4"], log_dir=tmp_path)
            result = proc.wait(timedelta(seconds=10))
            assert result is not None and result.state is JobState.EXITED

        base = ["jobs", "--target", running.target, "--insecure"]
        text = CliRunner().invoke(main, [*base, "--worker", "w1"], catch_exceptions=False)
        assert text.exit_code == 0, text.output
        assert text.output.splitlines() == [
            f"{proc.job_id} task=t1 EXITED(4) not-current pid={proc.pid}@{proc.record.host} "
            f"gen={job.generation} log={proc.log_ref} argv=sh -c 'exit 4'"
        ]
        as_json = CliRunner().invoke(main, [*base, "--worker", "w1", "--json"])
        (line,) = as_json.output.splitlines()
        record = json.loads(line)
        assert (record["job_id"], record["state"], record["exit_code"], record["current"]) == (
            proc.job_id,
            "EXITED",
            4,
            False,
        )
        # The caller's own jobs by default: the operator has none.
        empty = CliRunner().invoke(main, base)
        assert (empty.exit_code, empty.stdout) == (0, "")
        assert empty.stderr == (
            "no managed jobs for the calling principal (--worker PRINCIPAL lists a worker's jobs)\n"
        )
