"""c. The ``etcd3`` client's Lock recipe, one lock per task: acquire, write the result, release.

The recipe grants a lease and creates the lock key on it in a txn (acquire) and deletes the key
if it still holds its uuid (release). It has no fencing token and it leaves the lease to expire
on its own. Those leases are revoked after the run, off the clock, so that their expiry does not
land in another scenario's window: the recipe's own figures therefore leave out that later cost.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import etcd3

from bench.harness import CycleFn, RunSpec, Scenario
from bench.procs import GRPC_OPTIONS
from bench.scenarios.coordinator import RESULT

PREFIX = "/bench-lock"
TTL = 30


class LockScenario(Scenario):
    """etcd3 ``client.lock(name, ttl)``: acquire -> put result -> release."""

    key = "c"
    title = "etcd3 Lock recipe: acquire + put result + release (no fencing)"

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self._host, self._port = host, port
        self._clients: list[Any] = []
        self._leases: list[int] = []
        self._leases_lock = threading.Lock()
        self._run = ""

    def setup(self, max_level: int) -> None:
        """One client per worker."""
        for _ in range(len(self._clients), max_level):
            self._clients.append(
                etcd3.client(self._host, self._port, timeout=10, grpc_options=GRPC_OPTIONS)
            )

    def prepare(self, spec: RunSpec) -> list[CycleFn]:
        """Nothing to seed: every cycle locks a fresh name."""
        self._run = spec.name
        return [
            self._cycle(client, f"{spec.name}/w{i:02d}")
            for i, client in enumerate(self._clients[: spec.level])
        ]

    def _cycle(self, client: Any, name: str) -> CycleFn:
        counter = itertools.count()

        def cycle() -> tuple[float, float]:
            task = f"{name}/t{next(counter):07d}"
            lock = client.lock(f"bench/{task}", ttl=TTL)
            t0 = time.perf_counter()
            if not lock.acquire(timeout=10):
                raise RuntimeError(f"lock {task} not acquired")
            t1 = time.perf_counter()
            client.put(f"{PREFIX}/results/{task}", RESULT)
            if not lock.release():
                raise RuntimeError(f"lock {task} was not ours at release")
            t2 = time.perf_counter()
            with self._leases_lock:
                self._leases.append(lock.lease.id)
            return t1 - t0, t2 - t1

        return cycle

    def finish(self) -> None:
        """Revoke the leases the recipe left behind, and drop the run's results."""
        with self._leases_lock:
            leases, self._leases = self._leases, []
        revoke_all(self._clients, leases)
        if self._run:
            self._clients[0].delete_prefix(f"{PREFIX}/results/{self._run}/")
            self._run = ""

    def close(self) -> None:
        """Close every client."""
        for client in self._clients:
            client.close()


def revoke_all(clients: list[Any], leases: list[int]) -> None:
    """Revoke ``leases``, spread over the clients' channels."""
    if not leases:
        return
    width = min(len(clients), 16)
    with ThreadPoolExecutor(width, thread_name_prefix="revoke") as pool:
        futures = [pool.submit(_revoke_slice, clients[i], leases[i::width]) for i in range(width)]
        for future in futures:
            future.result()


def _revoke_slice(client: Any, leases: list[int]) -> None:
    for lease_id in leases:
        client.revoke_lease(lease_id)
