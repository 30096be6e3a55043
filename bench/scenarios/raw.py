"""b. The raw floor: the claim and the fenced commit issued straight to etcd, no front-end.

The four operations of the issue's hand-written cycle, with the ``etcd3`` client's public API:

1. lease grant;
2. claim txn: the task key's mod_revision is the one seeded, no claim key exists and the epoch
   is current -> put the claim key on the lease, put the task record (CLAIMED);
3. commit txn, behind the same fence the coordinator uses (claim key created at the claim's
   revision, task key not written since, epoch current) -> put the result, put the task record
   (DONE), delete the claim key;
4. lease revoke.

The claim's revision (the fencing token) comes from the put's response header. The cycle knows
each task's revision from seeding, so it reads nothing: this is the floor.
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any

import etcd3

from bench.harness import CycleFn, Exhausted, RunSpec, Scenario
from bench.procs import GRPC_OPTIONS
from bench.scenarios.coordinator import RESULT

PREFIX = "/bench-raw"
TTL = 30
_BATCH = 120  # task keys per seeding txn (etcd allows 128 operations)


class RawFloorScenario(Scenario):
    """lease grant -> claim txn -> commit txn -> lease revoke, on the etcd3 client."""

    key = "b"
    title = "raw floor: etcd3 client, lease + claim txn + fenced commit txn + revoke"

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self._host, self._port = host, port
        self._clients: list[Any] = []
        self._tasks: collections.deque[tuple[str, int]] = collections.deque()
        self._run = ""

    def setup(self, max_level: int) -> None:
        """One client per worker; write the epoch key the fence compares."""
        for _ in range(len(self._clients), max_level):
            self._clients.append(
                etcd3.client(self._host, self._port, timeout=10, grpc_options=GRPC_OPTIONS)
            )
        self._clients[0].put(f"{PREFIX}/epoch", b"1")

    def prepare(self, spec: RunSpec) -> list[CycleFn]:
        """Seed ``expected_cycles`` READY task keys and remember each one's revision."""
        self._run = f"{PREFIX}/{spec.name}"
        client = self._clients[0]
        value = json.dumps({"state": "READY", "queue": spec.name}).encode()
        self._tasks.clear()
        for start in range(0, spec.expected_cycles, _BATCH):
            keys = [
                f"{self._run}/tasks/t{i:07d}"
                for i in range(start, min(start + _BATCH, spec.expected_cycles))
            ]
            _, responses = client.transaction(
                compare=[], success=[client.transactions.put(k, value) for k in keys], failure=[]
            )
            revision = responses[0].response_put.header.revision
            self._tasks.extend((k, revision) for k in keys)
        return [
            _cycle(client, self._tasks, self._run, f"bench-w{i:02d}")
            for i, client in enumerate(self._clients[: spec.level])
        ]

    def finish(self) -> None:
        """Drop the run's keys."""
        if self._run:
            self._clients[0].delete_prefix(self._run + "/")
            self._run = ""

    def close(self) -> None:
        """Close every client."""
        for client in self._clients:
            client.close()


def _cycle(client: Any, tasks: collections.deque[tuple[str, int]], run: str, owner: str) -> CycleFn:
    txn = client.transactions
    epoch = f"{PREFIX}/epoch"

    def cycle() -> tuple[float, float]:
        try:
            task, seeded = tasks.popleft()
        except IndexError:
            raise Exhausted(run) from None
        name = task.rsplit("/", 1)[1]
        claim_key, result_key = f"{run}/claims/{name}", f"{run}/results/{name}"
        t0 = time.perf_counter()
        lease = client.lease(TTL)
        claimed = json.dumps({"state": "CLAIMED", "owner": owner, "lease": lease.id}).encode()
        ok, responses = client.transaction(
            compare=[txn.mod(task) == seeded, txn.create(claim_key) == 0, txn.value(epoch) == b"1"],
            success=[txn.put(claim_key, owner, lease=lease), txn.put(task, claimed)],
            failure=[],
        )
        if not ok:
            raise RuntimeError(f"claim txn of {task} failed its compares")
        generation = responses[0].response_put.header.revision
        t1 = time.perf_counter()
        done = json.dumps({"state": "DONE", "owner": owner, "generation": generation}).encode()
        ok, _ = client.transaction(
            compare=[
                txn.create(claim_key) == generation,
                txn.mod(task) == generation,
                txn.value(epoch) == b"1",
            ],
            success=[txn.put(result_key, RESULT), txn.put(task, done), txn.delete(claim_key)],
            failure=[],
        )
        if not ok:
            raise RuntimeError(f"commit txn of {task} failed its fence")
        lease.revoke()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    return cycle
