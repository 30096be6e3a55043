"""A hostile worker for the fairness tests: ``python -m tests.server.flooder TARGET THREADS``
sends RenewMany of 1,000 made-up fences as principal "flooder" from THREADS threads back to
back, in a process of its own (so its client work does not slow the server under test), until
its stdin closes (its parent ended it, or died); then prints the calls' status codes and the
items' outcomes as JSON."""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter

import grpc

from bench.hostile_flood import made_up
from coordinator.v1 import worker_pb2_grpc
from tests.lifecycle.support import who


def main(target: str, threads: int) -> None:
    """Flood until stdin closes; print what came back."""
    stop, lock = threading.Event(), threading.Lock()
    codes: Counter[str] = Counter()
    outcomes: Counter[int] = Counter()
    channel = grpc.insecure_channel(target)
    stub = worker_pb2_grpc.WorkerServiceStub(channel)

    def run(n: int) -> None:
        request = made_up(n)
        while not stop.is_set():
            try:
                response = stub.RenewMany(request, metadata=who("flooder"), timeout=10)
            except grpc.RpcError as exc:
                with lock:
                    codes[exc.code().name] += 1
                continue
            with lock:
                codes["OK"] += 1
                outcomes.update(r.renewal.outcome for r in response.results)

    workers = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    sys.stdin.read()
    stop.set()
    for worker in workers:
        worker.join()
    print(json.dumps({"codes": codes, "outcomes": {str(k): v for k, v in outcomes.items()}}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
