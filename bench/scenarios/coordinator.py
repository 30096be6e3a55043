"""a. The coordinator: ``claim_next`` -> ``claim.commit`` through the gRPC front-end, as a worker.

Each worker thread has its own ``WorkerClient`` (its own principal and channel) and claims from
the run's queue, seeded just before the run. The keepalive is not started: a cycle takes
milliseconds against a 30 s TTL, and a worker whose work is that short would not start one
either (``with claim:`` would add a thread start and a release check per cycle).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from bench.harness import CycleFn, Exhausted, RunSpec, Scenario
from bench.procs import GRPC_OPTIONS
from bench.seed import TaskSeeder
from coordinator.sdk import Claim, ClaimRefused, Outcome, WorkerClient

RESULT = b"benchmark result: 64 bytes, identical in every scenario of the run."
"""The result every scenario writes."""

TTL = timedelta(seconds=30)

# A worker told NO_READY_TASK while the run's queue still has unclaimed tasks asks again at once
# (see _Queue), at most this many times in a row before it takes the answer as the end.
_MAX_FALSE_EMPTY = 100


class _Queue:
    """The run's queue as the benchmark knows it: how many seeded tasks are still unclaimed.

    ClaimNext can answer NO_READY_TASK while ready tasks remain: under contention every one of
    its tries can lose its race. Such answers are counted, and the worker asks again (as a
    polling worker would, only without sleeping), so the run keeps its concurrency.
    """

    def __init__(self, name: str, tasks: int) -> None:
        self.name = name
        self._left = tasks
        self.false_empty = 0
        self._lock = threading.Lock()

    def claimed(self, count: int = 1) -> None:
        with self._lock:
            self._left -= count

    def refused_while_not_empty(self) -> bool:
        """Count a NO_READY_TASK; True if tasks remain (so it was a false 'empty')."""
        with self._lock:
            if self._left <= 0:
                return False
            self.false_empty += 1
            return True


class CoordinatorScenario(Scenario):
    """ClaimNext -> Commit with the worker SDK."""

    key = "a"
    title = "coordinator: SDK ClaimNext -> Commit (gRPC front-end)"

    def __init__(self, target: str, seeder: TaskSeeder) -> None:
        super().__init__()
        self._target = target
        self._seeder = seeder
        self._clients: list[WorkerClient] = []
        self._queue: _Queue | None = None

    def setup(self, max_level: int) -> None:
        """One client per worker; each pins the epoch once, as a long-lived worker does."""
        for i in range(len(self._clients), max_level):
            client = WorkerClient(
                self._target, principal=f"bench-w{i:02d}", channel_options=GRPC_OPTIONS
            )
            client.epoch()
            self._clients.append(client)

    def prepare(self, spec: RunSpec) -> list[CycleFn]:
        """Seed the run's queue; one cycle function per worker."""
        self._queue = _Queue(f"tp-{spec.name}", spec.expected_cycles)
        self._seeder.seed(self._queue.name, spec.expected_cycles)
        return [_cycle(client, self._queue) for client in self._clients[: spec.level]]

    def finish(self) -> None:
        """Drop what the run left in its queue, so no ready key outlives the run."""
        if self._queue is not None:
            self._seeder.drop(self._queue.name)

    def counters(self) -> dict[str, int]:
        """How often ClaimNext answered NO_READY_TASK although ready tasks remained."""
        return {"false_no_ready_task": self._queue.false_empty if self._queue else 0}

    def close(self) -> None:
        """Close every client."""
        for client in self._clients:
            client.close()


def _cycle(client: WorkerClient, queue: _Queue) -> CycleFn:
    def cycle() -> tuple[float, float]:
        t0 = time.perf_counter()
        for _ in range(_MAX_FALSE_EMPTY):
            claim = client.claim_next(queue.name, ttl=TTL)
            if not isinstance(claim, ClaimRefused):
                break
            if claim.outcome is not Outcome.NO_READY_TASK:
                raise RuntimeError(f"claim refused: {claim.outcome.name}/{claim.reason.name}")
            if not queue.refused_while_not_empty():
                raise Exhausted(queue.name)
        else:
            raise Exhausted(queue.name)
        t1 = time.perf_counter()
        queue.claimed()
        outcome = claim.commit(RESULT)
        t2 = time.perf_counter()
        if not outcome.committed:
            raise RuntimeError(f"commit answered {outcome.outcome.name}/{outcome.reason.name}")
        return t1 - t0, t2 - t1

    return cycle


class BatchedCoordinatorScenario(CoordinatorScenario):
    """e. The coordinator with the batched worker loop: ``claim_many`` fills a worker's hand,
    then every commit claims the next task in the same call (``commit_and_next``): one call per
    task of a busy queue instead of two."""

    key = "e"
    title = "coordinator, batched: claim_many(4) + commit_and_next (one call per task)"

    def prepare(self, spec: RunSpec) -> list[CycleFn]:
        """Seed the run's queue; one cycle function (and hand of claims) per worker."""
        self._queue = _Queue(f"tp-{spec.name}", spec.expected_cycles)
        self._seeder.seed(self._queue.name, spec.expected_cycles)
        return [_batched_cycle(client, self._queue) for client in self._clients[: spec.level]]


BATCH = 4
"""Tasks a batched worker claims when its hand is empty."""


def _batched_cycle(client: WorkerClient, queue: _Queue) -> CycleFn:
    hand: list[Claim] = []

    def cycle() -> tuple[float, float]:
        t0 = time.perf_counter()
        if not hand:
            hand.extend(_claim_hand(client, queue))
        t1 = time.perf_counter()
        outcome, more = hand.pop().commit_and_next(RESULT, queue=queue.name, ttl=TTL)
        t2 = time.perf_counter()
        if not outcome.committed:
            raise RuntimeError(f"commit answered {outcome.outcome.name}/{outcome.reason.name}")
        queue.claimed(len(more))
        hand.extend(more)
        return t1 - t0, t2 - t1

    return cycle


def _claim_hand(client: WorkerClient, queue: _Queue) -> list[Claim]:
    """Up to BATCH claims in one call (asking again after a false 'empty', as a's cycle does)."""
    for _ in range(_MAX_FALSE_EMPTY):
        got = client.claim_many(queue.name, ttl=TTL, max_tasks=BATCH)
        if not isinstance(got, ClaimRefused):
            queue.claimed(len(got))
            return got
        if got.outcome is not Outcome.NO_READY_TASK:
            raise RuntimeError(f"claim refused: {got.outcome.name}/{got.reason.name}")
        if not queue.refused_while_not_empty():
            raise Exhausted(queue.name)
    raise Exhausted(queue.name)
