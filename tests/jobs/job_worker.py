"""A worker process for the rediscover tests (``python -m tests.jobs.job_worker``).

Claims each ``--task ID:TTL``, keeps it alive, runs one managed job on it (``sh -c 'sleep 300 &
wait'``: a shell and its child), prints one JSON line per job (task, job_id, pid, generation),
then ``{"ready": true}``, and waits to be killed.
"""

from __future__ import annotations

import argparse
import json
import threading
from datetime import timedelta

from coordinator.sdk import Claim, WorkerClient

COMMAND = ["sh", "-c", "sleep 300 & wait"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--principal", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--task", action="append", required=True)
    args = parser.parse_args()
    client = WorkerClient(
        args.target, principal=args.principal, channel_options=[("grpc.enable_http_proxy", 0)]
    )
    for spec in args.task:
        task_id, ttl = spec.split(":")
        job = client.claim(task_id, ttl=timedelta(seconds=int(ttl)))
        assert isinstance(job, Claim), job
        job.start()
        proc = job.run(COMMAND, log_dir=args.log_dir)
        line = {"task": task_id, "job_id": proc.job_id, "pid": proc.pid, "gen": job.generation}
        print(json.dumps(line), flush=True)
    print(json.dumps({"ready": True}), flush=True)
    threading.Event().wait()  # until SIGKILL


if __name__ == "__main__":
    main()
