"""A RenewMany flood in a process of its own (issue 25's second row): ``python -m
bench.hostile_flood TARGET CALLERS`` sends, from CALLERS threads back to back as one worker
token ("flooder"), RenewMany calls of 1,000 made-up fences each, until its stdin closes (the
bench ended it, or died); then prints the calls' status codes as one JSON line. Its own process,
so its client work does not count as the coordinator's or slow the bench's timings."""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter

import grpc

from bench.hostile_writes import who
from bench.procs import GRPC_OPTIONS
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc

FENCES = 1000


def made_up(n: int) -> worker_pb2.RenewManyRequest:
    """``FENCES`` fences of tasks that do not exist (generations 1-3: below any live revision);
    the fairness tests' flooder (tests/server/flooder.py) sends the same."""
    fences = [
        types_pb2.Fence(
            task_id=f"made-up-{n}-{i}",
            attempt_id=f"a1-{i}",
            claim_generation=1 + i % 3,
            scheduler_epoch=1,
        )
        for i in range(FENCES)
    ]
    return worker_pb2.RenewManyRequest(renewals=[worker_pb2.RenewRequest(fence=f) for f in fences])


def main(target: str, callers: int) -> None:
    """Flood until stdin closes; print the status codes that came back."""
    stop, lock = threading.Event(), threading.Lock()
    codes: Counter[str] = Counter()
    channel = grpc.insecure_channel(target, options=GRPC_OPTIONS)
    stub = worker_pb2_grpc.WorkerServiceStub(channel)

    def run(n: int) -> None:
        request = made_up(n)
        while not stop.is_set():
            try:
                stub.RenewMany(request, metadata=who("flooder", "worker"), timeout=10)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            with lock:
                codes[code] += 1

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(callers)]
    for thread in threads:
        thread.start()
    sys.stdin.read()
    stop.set()
    for thread in threads:
        thread.join(15)
    channel.close()
    print(json.dumps(dict(codes)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
