"""Long polls for a pool of hundreds: one replica holding 1,000 waiting ClaimNext and 1,000
follow streams, and what that costs the calls that must stay fast (issue 25, item 5).

On a freshly started coordinator (the server's default bounds): unary calls are timed idle
(GetTask of a claimed task and RenewMany of its claim, alternately); then ``polls`` ClaimNext
calls wait (a fifth from agents with a token each, the rest from one token a whole pool shares,
as the chart gives every pod of a pool the same one; each sent again when it ends empty, as a
pool polls) and the same calls are timed again; then
``follows`` WatchEvents follow streams open beside them (from now, from ``READERS``
principals) and the calls are timed a third time. Figures: how many of each were admitted
(the rest were refused), unary p99 in each state over idle, the coordinator's memory, its CPU
over a quiet while in each state (what holding the calls costs), and how many waiters
``WOKEN`` new tasks woke (each exactly one). The calls are futures: grpc's own threads carry
them, not one bench thread each.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import etcd3
import grpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS, CoordinatorProcess, cpu_seconds, rss_mib, wait_quiet
from bench.stats import median, ms, percentile, ratio
from coordinator.etcd_process import EtcdProcess
from coordinator.server.identity import PRINCIPAL_METADATA_KEY, ROLES_METADATA_KEY
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)

PREFIX = "/coordinator-bench-long-polls"
QUEUE = "pool"
WAIT = 20.0
"""Seconds each poll waits (the server's max_claim_wait), and at most for the woken polls."""
SAMPLES = 200
BATCHES = 3
READERS = 200
"""Principals the follow streams come from (5 each of 1,000: dashboards, pm tools): the
pool's shared token already borrows for its polls."""
QUIET = 1.5
SETTLE = 3.0
"""Seconds at most to wait for the coordinator to go quiet after opening the calls."""
CHANNELS = 8
WOKEN = 50


def _who(principal: str, role: str) -> tuple[tuple[str, str], ...]:
    return ((PRINCIPAL_METADATA_KEY, principal), (ROLES_METADATA_KEY, role))


class _Pool:
    """Channels to the coordinator, the stubs over them, and a claim to time renewals on."""

    def __init__(self, target: str, stack: ExitStack) -> None:
        self.channels = [
            stack.enter_context(grpc.insecure_channel(target, options=GRPC_OPTIONS))
            for _ in range(CHANNELS)
        ]
        self.worker = [worker_pb2_grpc.WorkerServiceStub(c) for c in self.channels]
        self.tasks = [tasks_pb2_grpc.TaskServiceStub(c) for c in self.channels]
        admin = admin_pb2_grpc.AdminServiceStub(self.channels[0])
        self.epoch = admin.GetEpoch(admin_pb2.GetEpochRequest(), metadata=_who("pm", "pm")).epoch
        self.tasks[0].CreateTask(
            tasks_pb2.CreateTaskRequest(task_id="timed", queue="timed"), metadata=_who("pm", "pm")
        )
        claim = self.worker[0].Claim(
            worker_pb2.ClaimRequest(task_id="timed", scheduler_epoch=self.epoch, ttl_seconds=60),
            metadata=_who("timer", "worker"),
        )
        self.fence = claim.fence

    def unary_ms(self) -> dict[str, Any]:
        """GetTask and RenewMany, alternately, in ``BATCHES`` batches of ``SAMPLES``: the p50
        of all of them and the median of the batches' p99 in ms. A machine shared with other
        work puts a burst of its own into one batch now and then; the median keeps it from
        deciding the figure, and the batches' p99s say how far apart they were."""
        get = tasks_pb2.GetTaskRequest(task_id="timed")
        renew = worker_pb2.RenewManyRequest(renewals=[worker_pb2.RenewRequest(fence=self.fence)])
        batches: list[list[float]] = []
        for _ in range(BATCHES):
            took = []
            for n in range(SAMPLES):
                started = time.perf_counter()
                if n % 2:
                    self.tasks[n % CHANNELS].GetTask(get, metadata=_who("pm", "pm"), timeout=30)
                else:
                    self.worker[n % CHANNELS].RenewMany(
                        renew, metadata=_who("timer", "worker"), timeout=30
                    )
                took.append(time.perf_counter() - started)
            batches.append(took)
        p99s = [p for p in (percentile(took, 99) for took in batches) if p is not None]
        return {
            "p50": ms(percentile([t for took in batches for t in took], 50)),
            "p99": ms(median(p99s)),
            "p99_batches": [ms(p) for p in p99s],
        }

    def poll(self, n: int, principal: str) -> grpc.Future:  # type: ignore[type-arg]
        request = worker_pb2.ClaimNextRequest(
            queue=QUEUE, scheduler_epoch=self.epoch, ttl_seconds=60, wait_seconds=WAIT
        )
        return self.worker[n % CHANNELS].ClaimNext.future(
            request, metadata=_who(principal, "worker"), timeout=WAIT + 30
        )

    def follow(self, n: int, principal: str, after: int) -> Any:
        request = tasks_pb2.WatchEventsRequest(follow=True, from_revision=after)
        return self.tasks[n % CHANNELS].WatchEvents(
            request, metadata=_who(principal, "pm"), timeout=WAIT + 30
        )


def _principal(n: int, count: int) -> str:
    """A fifth of the callers own a token each; the rest share one (the pool's)."""
    return f"agent-{n}" if n < count // 5 else "pool"


def _state(pid: int, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``measure()``, then the coordinator's CPU (cores) over a quiet ``QUIET`` seconds (what
    holding the calls costs by itself), its memory and its threads."""
    timed = measure()
    cpu, started = cpu_seconds(pid), time.monotonic()
    time.sleep(QUIET)
    cores = (cpu_seconds(pid) - cpu) / (time.monotonic() - started)
    return {
        **timed,
        "quiet_cpu_cores": round(cores, 3),
        "rss_mib": round(rss_mib(pid), 1),
        "threads": len(os.listdir(f"/proc/{pid}/task")),
    }


def run_long_polls(
    target: str, pid: int, revision: Callable[[], int], *, polls: int, follows: int
) -> dict[str, Any]:
    """The three states on the coordinator at ``target`` (process ``pid``; ``revision()`` is
    etcd's current revision, which the follows start from); the figures."""
    with ExitStack() as stack:
        pool = _Pool(target, stack)
        pool.unary_ms()  # warm the channels and the server's threads
        idle = _state(pid, pool.unary_ms)
        waiting = _Polls(pool, polls)
        stack.callback(waiting.stop)
        # A refusal answers at once; an admitted poll waits. Timed once the opening is over:
        # the state is what is measured, not the arrival of the calls.
        wait_quiet([pid], limit=SETTLE)
        polls_refused = waiting.outcomes()["RESOURCE_EXHAUSTED"]
        with_polls = _state(pid, pool.unary_ms)
        after = revision()
        streams = [pool.follow(n, f"reader-{n % READERS}", after) for n in range(follows)]
        wait_quiet([pid], limit=SETTLE)
        follows_refused = sum(1 for s in streams if s.done())
        with_follows = _state(pid, pool.unary_ms)
        for n in range(WOKEN):
            pool.tasks[0].CreateTask(
                tasks_pb2.CreateTaskRequest(task_id=f"t-{n}", queue=QUEUE),
                metadata=_who("pm", "pm"),
            )
        until = time.monotonic() + WAIT
        while waiting.outcomes()["CLAIMED"] < WOKEN and time.monotonic() < until:
            time.sleep(0.1)
        outcomes = waiting.stop()
        for stream in streams:
            stream.cancel()
    result = {
        "polls": polls,
        "follows": follows,
        "polls_admitted": polls - polls_refused,
        "follows_admitted": follows - follows_refused,
        "tasks_created": WOKEN,
        "polls_claimed": outcomes["CLAIMED"],
        "polls_ended_empty_and_sent_again": outcomes["NO_READY_TASK"],
        "idle": idle,
        "with_polls": with_polls,
        "with_polls_and_follows": with_follows,
        "unary_p99_polls_over_idle": _rounded(ratio(with_polls["p99"], idle["p99"])),
        "unary_p99_polls_and_follows_over_idle": _rounded(ratio(with_follows["p99"], idle["p99"])),
    }
    say(
        f"long polls: {result['polls_admitted']}/{polls} polls and "
        f"{result['follows_admitted']}/{follows} follows admitted; unary p99 "
        f"{idle['p99']} ms idle, {with_polls['p99']} with polls, {with_follows['p99']} with "
        "both"
    )
    return result


class _Polls:
    """``count`` ClaimNext kept waiting, as a pool keeps polling: one that ends empty is sent
    again at once (so the measurement is not bound by one poll's wait); a refused one is not."""

    def __init__(self, pool: _Pool, count: int) -> None:
        self._pool = pool
        self._count = count
        self._lock = threading.Lock()
        self._outcomes: Counter[str] = Counter()
        self._open: dict[int, grpc.Future] = {}  # type: ignore[type-arg]
        self._stopped = False
        for n in range(count):
            self._send(n)

    def outcomes(self) -> Counter[str]:
        """How the polls ended so far (CLAIMED, NO_READY_TASK, or a status code)."""
        with self._lock:
            return Counter(self._outcomes)

    def stop(self) -> Counter[str]:
        """Send no more, cancel the waiting ones; how the polls ended before."""
        with self._lock:
            self._stopped = True
            waiting, outcomes = list(self._open.values()), Counter(self._outcomes)
        for future in waiting:
            future.cancel()
        return outcomes

    def _send(self, n: int) -> None:
        future = self._pool.poll(n, _principal(n, self._count))
        with self._lock:
            if self._stopped:
                future.cancel()
                return
            self._open[n] = future
        future.add_done_callback(lambda done: self._ended(n, done))

    def _ended(self, n: int, future: grpc.Future) -> None:  # type: ignore[type-arg]
        # On grpc's thread, once the poll ended; a cancelled one ended because of stop().
        if future.cancelled():
            return
        outcome = _outcome(future)
        with self._lock:
            if self._stopped:
                return
            self._outcomes[outcome] += 1
            again = outcome == "NO_READY_TASK"
        if again:
            self._send(n)


def _outcome(poll: grpc.Future) -> str:  # type: ignore[type-arg]
    """CLAIMED, NO_READY_TASK, or the status code a refused or failed poll ended with."""
    try:
        answer = poll.result(timeout=WAIT + 30)
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return str(types_pb2.Outcome.Name(answer.outcome)).removeprefix("OUTCOME_")


def long_polls_phase(etcd: EtcdProcess, workdir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """``run_long_polls`` on a freshly started coordinator over a keyspace of its own."""
    fresh = CoordinatorProcess(
        etcd.endpoint,
        prefix=PREFIX,
        log_path=workdir / "coordinator-long-polls.log",
        log_level=config["coordinator_log_level"],
    ).start()
    client = etcd3.client(etcd.host, etcd.port, grpc_options=GRPC_OPTIONS)
    try:
        return run_long_polls(
            fresh.target,
            fresh.pid,
            lambda: int(client.put(f"{PREFIX}/now", b"").header.revision),
            polls=config["long_polls"],
            follows=config["long_polls"],
        )
    finally:
        client.close()
        fresh.stop()


def long_polls_line(result: dict[str, Any]) -> str:
    """The phase as one paragraph of the report."""
    idle, polls, both = (
        result["idle"],
        result["with_polls"],
        result["with_polls_and_follows"],
    )
    return (
        f"Long polls: {result['polls_admitted']} of {result['polls']} waiting ClaimNext "
        f"admitted (a fifth with a token each, the rest one shared token), then "
        f"{result['follows_admitted']} of {result['follows']} follow streams; {WOKEN} new tasks "
        f"woke {result['polls_claimed']}. Unary p99 (GetTask/RenewMany, median of "
        f"{BATCHES} batches): {idle['p99']} ms idle, "
        f"{polls['p99']} ms with the polls waiting ({result['unary_p99_polls_over_idle']}x), "
        f"{both['p99']} ms with the follows too "
        f"({result['unary_p99_polls_and_follows_over_idle']}x). Coordinator: "
        f"{idle['rss_mib']} / {polls['rss_mib']} / {both['rss_mib']} MiB, "
        f"{idle['quiet_cpu_cores']} / {polls['quiet_cpu_cores']} / "
        f"{both['quiet_cpu_cores']} cores holding them, {idle['threads']} / "
        f"{polls['threads']} / {both['threads']} threads. p50 {idle['p50']} / {polls['p50']} / "
        f"{both['p50']} ms.\n"
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
