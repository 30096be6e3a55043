"""A real worker process for the reclaim measurement: claims on command, then holds the task.

Run as ``python -m bench.reclaim_worker --target ADDR --principal NAME``. Each stdin line
``claim QUEUE TTL`` makes it claim the next task of QUEUE with the SDK, start the keepalive (a
2 s TTL demands one, as it would in a real worker) and print one JSON line with the task, the
generation and the server's ``lease_expires_at``; the benchmark SIGSTOPs it right then. The next
line (after SIGCONT) first drops that claim without releasing it. ``exit`` ends the process.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

from bench.procs import GRPC_OPTIONS
from coordinator.logging import configure_logging
from coordinator.sdk import Claim, ClaimRefused, Outcome, WorkerClient

_CLAIM_PATIENCE = 10.0  # seconds to wait for the seeded task to show up in the ready index


def _claim(client: WorkerClient, queue: str, ttl: int) -> Claim | str:
    deadline = time.monotonic() + _CLAIM_PATIENCE
    while True:
        claimed = client.claim_next(queue, ttl=timedelta(seconds=ttl))
        if not isinstance(claimed, ClaimRefused):
            return claimed
        if claimed.outcome is not Outcome.NO_READY_TASK or time.monotonic() > deadline:
            return f"claim refused: {claimed.outcome.name}/{claimed.reason.name}"
        time.sleep(0.005)


def _say(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def main() -> None:
    """Serve ``claim`` commands from stdin until ``exit`` or end of input."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--principal", required=True)
    ns = parser.parse_args()
    configure_logging("error")  # the SDK's "claim lost" warnings after SIGCONT are expected
    held: Claim | None = None
    with WorkerClient(ns.target, principal=ns.principal, channel_options=GRPC_OPTIONS) as client:
        _say({"op": "started", "pid": os.getpid()})
        for line in sys.stdin:
            if held is not None:
                held.close()  # stop its keepalive; the task is someone else's by now
                held = None
            words = line.split()
            if not words or words[0] == "exit":
                break
            claimed = _claim(client, words[1], int(words[2]))
            claimed_at = time.time()
            if isinstance(claimed, str):
                _say({"op": "error", "message": claimed})
                continue
            held = claimed.start()
            expires = claimed.lease_expires_at
            _say(
                {
                    "op": "holding",
                    "task": claimed.task_id,
                    "generation": claimed.generation,
                    "ttl": claimed.ttl.total_seconds(),
                    "lease_expires_at": expires.timestamp() if expires else None,
                    "claimed_at": claimed_at,
                    "pid": os.getpid(),
                }
            )


if __name__ == "__main__":
    main()
