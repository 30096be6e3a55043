"""A worker process to freeze: claims one task, says so, waits for a line on stdin, commits.

    python -m tests.sdk.paused_worker --sdk async --target ADDR --task t1

Prints one JSON line ``{"op": "holding", "generation": ...}`` once its claim's keepalive runs,
then, after any line on stdin, ``{"op": "commit", "outcome": ..., "reason": ..., "losses":
[...]}``: what its commit was answered and every loss its ``on_lost`` callback was told of.
With ``--sdk async`` it is an asyncio program (``asyncio.run``; the keepalive is a task on its
loop, the wait for stdin a thread), with ``--sdk sync`` a threaded one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import timedelta
from typing import Any

from coordinator.logging import configure_logging
from coordinator.sdk import ClaimRefused, CommitOutcome, LostReason, WorkerClient
from coordinator.sdk.aio import AsyncWorkerClient

OPTIONS = [("grpc.enable_http_proxy", 0)]
TTL = timedelta(seconds=1)


def emit(op: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed."""
    print(json.dumps({"op": op, **fields}), flush=True)


def report(outcome: CommitOutcome, losses: list[LostReason]) -> None:
    """The commit's answer and the losses the callback was told of."""
    emit(
        "commit",
        outcome=outcome.outcome.name,
        reason=outcome.reason.name,
        losses=[[lost.outcome.name, lost.reason.name, lost.source.value] for lost in losses],
    )


def run_sync(target: str, task: str) -> None:
    """The threaded worker."""
    losses: list[LostReason] = []
    with WorkerClient(target, principal="sleeper", channel_options=OPTIONS) as client:
        claim = client.claim(task, ttl=TTL, on_lost=losses.append)
        assert not isinstance(claim, ClaimRefused), claim
        with claim:
            emit("holding", generation=claim.generation)
            sys.stdin.readline()
            report(claim.commit(b"late"), losses)


async def run_async(target: str, task: str) -> None:
    """The asyncio worker."""
    losses: list[LostReason] = []
    async with AsyncWorkerClient(target, principal="sleeper", channel_options=OPTIONS) as client:
        claim = await client.claim(task, ttl=TTL, on_lost=losses.append)
        assert not isinstance(claim, ClaimRefused), claim
        async with claim:
            emit("holding", generation=claim.generation)
            await asyncio.to_thread(sys.stdin.readline)
            report(await claim.commit(b"late"), losses)


def main() -> None:
    """Parse the arguments and run the worker of the SDK asked for."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--sdk", choices=("sync", "async"), required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--task", required=True)
    args = parser.parse_args()
    configure_logging("info")  # stderr: stdout carries only the JSON lines
    if args.sdk == "sync":
        run_sync(args.target, args.task)
    else:
        asyncio.run(run_async(args.target, args.task))


if __name__ == "__main__":
    main()
