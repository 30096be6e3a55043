"""Run one scenario: start the harness, drive traffic, inject and heal one fault, then check.

Traffic: a producer creates a task every ``PRODUCE_EVERY`` seconds for the duration, while
``WORKERS`` chaos workers claim, send one effect each and commit. The fault is injected at a
seeded moment in the first half of the run and healed before the end; the run then waits until
every task is DONE, CANCELLED or FAILED (or a deadline passes) and hands the evidence to the
checker.
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from chaos.checker import CheckReport, Evidence, check
from chaos.fault import Fault
from chaos.faults import FAULTS
from chaos.follower import Follower
from chaos.harness import Harness, TlsFiles
from chaos.health import ClusterUnhealthy, require_healthy
from chaos.history import EtcdWrite, load
from coordinator import lifeline

WORKERS = 4
PRODUCE_EVERY = 0.1
SETTLE_TIMEOUT = 60.0
HEALTHY_BEFORE = 10.0
"""Seconds the cluster gets to be healthy before a fault (it has just started)."""
RECOVERY_TIMEOUT = 30.0
"""Seconds the cluster gets to be healthy again after a heal (an etcd member rejoining)."""
FOLLOW_CATCH_UP = 30.0
"""Seconds the WatchEvents follower gets, once the run settled, to reach etcd's last event."""


@dataclass(frozen=True)
class Result:
    """One scenario's outcome: a verdict, or the reason it was skipped."""

    scenario: str
    implementation: str
    verdict: CheckReport | None
    skipped: str = ""
    unhealthy: str = ""  # the cluster was unhealthy before the fault or after its heal
    unsettled: int = 0
    seconds: float = 0.0
    # How far the replicas' event timestamps lay outside the run's real wall-clock window
    # (seconds): about 300 under the clock-skew fault, about 0 otherwise.
    clock_offset: float = 0.0
    # How often the WatchEvents follower's stream broke (and resumed), by status code.
    follow_breaks: Mapping[str, int] = field(default_factory=dict)


def produce(h: Harness, until: float, created: set[str]) -> None:
    """Create tasks until ``until`` (monotonic); their ids go into ``created``."""
    with h.client("producer") as producer:
        n = 0
        while time.monotonic() < until:
            task_id = f"{h.queue}-t{n:04d}"
            try:
                producer.create_task(task_id, input=task_id.encode(), queue=h.queue)
                created.add(task_id)
            except Exception:
                pass  # not created (etcd or replica down): the checker does not expect it
            n += 1
            time.sleep(PRODUCE_EVERY)


def settle(h: Harness, timeout: float) -> int:
    """Wait until no task is pending; returns how many still are after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pending = h.unsettled()
        except Exception:
            pending = -1
        if pending == 0 or time.monotonic() > deadline:
            return pending
        time.sleep(0.25)


def run_fault(fault: Fault, h: Harness, delay: float, errors: list[BaseException]) -> None:
    """Inject after ``delay`` seconds, then heal (always); the cluster must be healthy before
    the injection and again after the heal (ClusterUnhealthy otherwise: chaos/health.py)."""
    time.sleep(delay)
    require_healthy(h.health_problems, timeout=HEALTHY_BEFORE, when=f"before {fault.name}")
    try:
        fault.inject(h)
    except BaseException as exc:
        errors.append(exc)
    finally:
        fault.heal(h)
    require_healthy(h.health_problems, timeout=RECOVERY_TIMEOUT, when=f"after healing {fault.name}")


def run_scenario(
    name: str,
    *,
    duration: float,
    seed: int,
    root: Path | None = None,
    target: str = "",
    token: str = "",
    tls: TlsFiles | None = None,
) -> Result:
    """Run the scenario ``name`` against the coordinator (a deployed one at ``target``) and
    check it."""
    fault = FAULTS[name]()
    reason = _skip_reason(fault, target)
    if reason:
        return Result(name, "coordinator", None, skipped=reason)
    if root is None:
        return in_temp_dir(
            f"chaos-{name}-",
            lambda d: run_scenario(
                name, duration=duration, seed=seed, root=d, target=target, token=token, tls=tls
            ),
        )
    rng = random.Random(seed)
    started, wall = time.monotonic(), time.time()
    h = Harness(
        root,
        proxied=fault.proxied,
        remote=target,
        token=token,
        skews=fault.skews,
        partitioned=fault.partition,
        tls=tls,
        replica_flags=fault.replica_flags,
    )
    follower: Follower | None = None
    try:
        h.start()
        follower = h.follower().start()  # through the whole run, fault included
        created: set[str] = set()
        for i in range(WORKERS):
            flags = fault.worker_flags if i == 0 else ()
            h.start_worker(
                f"w{i}", *flags, *fault.all_worker_flags, isolated=fault.partition and i == 0
            )
        producer = threading.Thread(
            target=produce, args=(h, time.monotonic() + duration, created), daemon=True
        )
        producer.start()
        errors: list[BaseException] = []
        unhealthy = ""
        try:
            run_fault(fault, h, rng.uniform(0.2, 0.4) * duration, errors)
        except ClusterUnhealthy as exc:
            unhealthy = str(exc)  # no verdict: the history would blame the coordinator for it
        producer.join()
        if unhealthy:
            return Result(name, "coordinator", None, unhealthy=unhealthy, seconds=elapsed(started))
        if errors:
            raise errors[0]
        pending = settle(h, SETTLE_TIMEOUT)
        h.stop_workers()
        writes = h.etcd_history()
        if writes:
            follower.wait_for(max(w.position for w in writes), FOLLOW_CATCH_UP)
        follower.stop()
        evidence = Evidence(
            ops=load(h.histories),
            final=h.final_tasks(),
            expected_tasks=frozenset(created),
            performed=h.performed(),
            coverage=h.coverage(),
            writes=writes,
            effect_writes=h.effect_history(),
            followed=follower.received,
            poisoned=fault.poisoned,
        )
        verdict = check(evidence)
    finally:
        if follower is not None:
            follower.stop()
        h.close()
    return Result(
        name,
        "coordinator",
        verdict,
        unsettled=pending,
        seconds=elapsed(started),
        clock_offset=offset(evidence.writes or (), wall, time.time()),
        follow_breaks=follower.breaks,
    )


def _skip_reason(fault: Fault, target: str) -> str:
    """Why ``fault`` cannot run here ("" when it can); of several, the last applies."""
    reason = fault.available()
    if target and fault.server_side:
        reason = "server-side fault: no process signals on a deployed coordinator (--target)"
    if target and fault.partition:
        reason = "the partition is made on this machine's local harness only (not --target)"
    if target and fault.local_only:
        reason = f"local harness only (not --target): {fault.local_only}"
    return reason


def in_temp_dir(prefix: str, run: Callable[[Path], Result]) -> Result:
    """``run`` in a fresh temporary directory (its etcd data, logs and histories: hundreds of
    MB), removed afterwards unless the coordinator's run failed or raised, when it is kept for
    inspection and its path printed on stderr."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    result: Result | None = None
    try:
        result = run(root)
        return result
    finally:
        failed = result is None or (
            result.implementation != "naive"
            and result.verdict is not None
            and not result.verdict.ok
        )
        if failed:
            print(f"chaos: kept {root} (the run's data and logs) for inspection", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def elapsed(since: float) -> float:
    """Seconds since ``since`` (monotonic)."""
    return time.monotonic() - since


def offset(writes: Iterable[EtcdWrite], start: float, end: float) -> float:
    """How far the writes' timestamps lie outside the real window ``[start, end]``."""
    return max((max(w.at - end, start - w.at, 0.0) for w in writes), default=0.0)


def run_naive(*, root: Path | None = None) -> Result:
    """The pause scenario against the naive baseline (chaos/naive.py): A claims and is frozen
    between its expiresAt check and its write; B takes over after the lease and commits; A wakes
    and writes. The checker must report it."""
    import subprocess
    import sys

    from chaos import naive
    from chaos.cluster import EtcdCluster
    from chaos.fault import wait_until
    from chaos.faults import PAST_TTL
    from chaos.harness import REPO, stopped

    if root is None:
        return in_temp_dir("chaos-naive-", lambda d: run_naive(root=d))
    started = time.monotonic()
    cluster = EtcdCluster(root)
    procs: list[subprocess.Popen[bytes]] = []

    def worker(name: str, *flags: str) -> subprocess.Popen[bytes]:
        args = ["--etcd", cluster.endpoints[0], "--name", name, "--task", "t1"]
        args += ["--history", str(root / f"{name}.jsonl"), *flags]
        procs.append(subprocess.Popen([sys.executable, "-m", "chaos.naive", *args], cwd=REPO))
        lifeline.kill_with_parent(procs[-1].pid)  # even if the run is SIGKILLed
        return procs[-1]

    try:
        cluster.start()
        client = cluster.client(cluster.members[0])
        naive.create(client, "t1")
        late = worker("a", "--pause")
        wait_until(lambda: stopped(late.pid), 30, "the naive worker to pause")
        time.sleep(PAST_TTL)
        worker("b").wait(timeout=30)
        late.send_signal(signal.SIGCONT)
        late.wait(timeout=30)
        found = naive.final(client, "t1")
        final = {"t1": found} if found is not None else {}
        client.close()
        ops = load(sorted(root.glob("*.jsonl")))
        verdict = check(Evidence(ops=ops, final=final, expected_tasks=frozenset({"t1"})))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        cluster.stop()
    return Result("worker-pause", "naive", verdict, seconds=time.monotonic() - started)
