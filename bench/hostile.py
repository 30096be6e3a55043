"""One token against the pool: issue 25's targets table at full size (bench phase ``hostile``).

On an etcd of the phase's own with a 256 MiB ``--quota-backend-bytes`` (and the chart's hour of
periodic compaction), each row on a freshly started coordinator told that quota, with the
server's default bounds (the chart's: write budgets of 256 KiB/s for a worker token and
1 MiB/s for a pm token over a 60 s window, four replays at once, two a principal):

1. writes (bench/hostile_writes.py): one worker token churning 64 KiB checkpoints and 512 KiB
   staged results for ``hostile_writes_s`` while a pool creates, claims and commits;
2. renewals (bench/hostile_renewals.py): 50 callers of one token sending RenewMany of 1,000
   made-up fences while an SDK client holds 500 claims of TTL 6 s;
3. replays: 32 whole-log WatchEvents replays from 4 tokens at once over a log of ``events``
   events: the coordinator's memory at its peak and once they ended. A history read holds one
   pass of 5,000 positions at most, so a log of 20,000 events already costs each replay its
   most; a longer log costs time (a scan per pass: 16 replays of 100,000 took 474 s on the
   2-core VM), not memory;
4. lists: ListTasks of a queue of 100 tasks with 256 KiB inputs, summaries and with inputs,
   every page read: pages, bytes, refusals.

The fifth row (1,000 waiting ClaimNext) is the ``long_polls`` phase (bench/long_polls.py).
Rows 3 and 4 run first: the writes row is the one that may fill etcd. ``--hostile-rows`` runs
some of the rows only (the replays row alone takes about 3 minutes, the phase about 8).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from bench.events import PeakRss, read_whole_log, run_daemons, write_events
from bench.harness import say
from bench.hostile_renewals import run_renewals
from bench.hostile_writes import run_writes, who
from bench.procs import GRPC_OPTIONS, CoordinatorProcess, rss_mib, wait_quiet
from bench.seed import TaskSeeder
from coordinator.domain.digests import digest_of
from coordinator.domain.keys import Keyspace
from coordinator.etcd_process import EtcdProcess, find_etcd_binary
from coordinator.store.etcd.kv import EtcdKV
from coordinator.v1 import tasks_pb2, tasks_pb2_grpc, types_pb2

PREFIX = "/coordinator-bench-hostile"
QUOTA = 256 << 20
INPUT = 256 << 10  # coordinator.domain.validation.MAX_INPUT_BYTES
REPLAYS, REPLAY_TOKENS = 32, 4
REPLAY_PATIENCE = 600.0
"""Seconds a refused replay keeps asking again (every 0.2 s) before it gives up."""
SETTLE = 30.0
REPLAYED_EVENTS_PER_S = 3000
"""What a loaded 2-core VM replays, all callers together (docs/performance.md, events): the
replay row's share of ``hostile_need``."""
ROWS = ("lists", "replays", "renewals", "writes")
"""The phase's rows in the order they run (``--hostile-rows`` picks some of them)."""


def hostile_need(config: dict[str, Any]) -> float:
    """Seconds the phase needs at most (its chosen rows' durations and their set-up)."""
    rows = config["hostile_rows"]
    durations = {
        "lists": 0.0,
        "replays": REPLAYS * config["hostile_events"] / REPLAYED_EVENTS_PER_S,
        "renewals": config["hostile_flood_s"],
        "writes": config["hostile_writes_s"],
    }
    return float(sum(durations[row] for row in rows) + 30 * len(rows))


def hostile_phase(workdir: Path, config: dict[str, Any], etcd_bin: str | None) -> dict[str, Any]:
    """The chosen rows on an etcd of their own with a 256 MiB quota (module docstring)."""
    with EtcdProcess(
        binary=find_etcd_binary(etcd_bin),
        log_path=workdir / "etcd-hostile.log",
        quota_backend_bytes=QUOTA,
    ) as etcd:
        kv = EtcdKV.connect([etcd.endpoint], timeout=60)
        try:
            rows: list[tuple[str, Callable[[CoordinatorProcess, Keyspace], dict[str, Any]]]] = [
                ("lists", lambda c, _: run_lists(c.target, tasks=config["hostile_list_tasks"])),
                ("replays", lambda c, k: run_replays(c, kv, k, events=config["hostile_events"])),
                (
                    "renewals",
                    lambda c, k: run_renewals(
                        c.target,
                        TaskSeeder(kv, k),
                        claims=config["hostile_claims"],
                        callers=config["hostile_flooders"],
                        seconds=config["hostile_flood_s"],
                    ),
                ),
                (
                    "writes",
                    lambda c, _: run_writes(
                        c.target,
                        (etcd.host, etcd.port),
                        quota=QUOTA,
                        seconds=config["hostile_writes_s"],
                    ),
                ),
            ]
            result: dict[str, Any] = {"quota_mib": QUOTA >> 20}
            for name, run in rows:
                if name in config["hostile_rows"]:
                    result[name] = _on_fresh(name, etcd, workdir, config, run)
            return result
        finally:
            kv.close()


def _on_fresh(
    name: str,
    etcd: EtcdProcess,
    workdir: Path,
    config: dict[str, Any],
    run: Callable[[CoordinatorProcess, Keyspace], dict[str, Any]],
) -> dict[str, Any]:
    """``run`` against a coordinator started for it alone, over a keyspace of its own."""
    prefix = f"{PREFIX}-{name}"
    fresh = CoordinatorProcess(
        etcd.endpoint,
        prefix=prefix,
        log_path=workdir / f"coordinator-hostile-{name}.log",
        log_level=config["coordinator_log_level"],
        extra_args=[f"--etcd-quota-bytes={QUOTA}"],
    ).start()
    try:
        return run(fresh, Keyspace(prefix))
    finally:
        fresh.stop()


def run_replays(
    coordinator: CoordinatorProcess, kv: EtcdKV, keys: Keyspace, *, events: int
) -> dict[str, Any]:
    """``REPLAYS`` whole-log replays from ``REPLAY_TOKENS`` tokens at once, each refused one
    asked again until it ran; the coordinator's memory before, at its peak and after."""
    write_events(kv, keys, 0, events)
    pid = coordinator.pid
    wait_quiet([pid], limit=SETTLE)
    before = rss_mib(pid)
    received, refused = [0] * REPLAYS, Counter[str]()
    lock = threading.Lock()
    channel = grpc.insecure_channel(coordinator.target, options=GRPC_OPTIONS)
    stub = tasks_pb2_grpc.TaskServiceStub(channel)

    def count(code: str) -> None:
        with lock:
            refused[code] += 1

    def replay(n: int) -> None:
        metadata = who(f"reader-{n % REPLAY_TOKENS}", "pm")
        # A replay that failed for good is counted in ``refused`` and left incomplete.
        with contextlib.suppress(grpc.RpcError):
            read_whole_log(stub, metadata, received, n, patience=REPLAY_PATIENCE, refused=count)

    started = time.monotonic()
    try:
        with PeakRss(pid) as during:
            run_daemons(replay, REPLAYS)
        took = time.monotonic() - started
    finally:
        channel.close()
    wait_quiet([pid], limit=SETTLE)
    after = rss_mib(pid)
    result = {
        "events": events,
        "replays": REPLAYS,
        "tokens": REPLAY_TOKENS,
        "replays_complete": sum(1 for n in received if n == events),
        "refusals": dict(refused),
        "seconds": round(took, 1),
        "rss_mib_before": round(before, 1),
        "rss_growth_mib_peak": round(during.peak - before, 1),
        "rss_growth_mib_after": round(after - before, 1),
    }
    say(
        f"hostile replays: {result['replays_complete']}/{REPLAYS} complete, refused "
        f"{dict(refused)}; RSS +{result['rss_growth_mib_peak']} MiB at peak, "
        f"+{result['rss_growth_mib_after']} MiB after"
    )
    return result


def run_lists(target: str, *, tasks: int) -> dict[str, Any]:
    """``tasks`` tasks with the largest inputs in one queue, then every page of ListTasks by
    queue (summaries, then with inputs) and by state."""
    pm = who("lister", "pm")
    with grpc.insecure_channel(target, options=GRPC_OPTIONS) as channel:
        stub = tasks_pb2_grpc.TaskServiceStub(channel)
        for n in range(tasks):
            data = os.urandom(INPUT)  # etcd stores it as sent: incompressible is the worst case
            stub.CreateTask(
                tasks_pb2.CreateTaskRequest(
                    task_id=f"big-{n}", queue="big", input=data, input_digest=digest_of(data)
                ),
                metadata=pm,
                timeout=30,
            )
        ways = {
            "queue": tasks_pb2.ListTasksRequest(queue="big", page_size=tasks),
            "queue_with_inputs": tasks_pb2.ListTasksRequest(
                queue="big", page_size=tasks, include_input=True
            ),
            "state": tasks_pb2.ListTasksRequest(state=types_pb2.TASK_STATE_READY, page_size=tasks),
        }
        result: dict[str, Any] = {"tasks": tasks, "input_kib": INPUT >> 10}
        result.update({way: _pages(stub, request, pm) for way, request in ways.items()})
    say(
        "hostile lists: "
        + "; ".join(
            f"{way} {result[way]['tasks_listed']} tasks in {result[way]['pages']} pages "
            f"({result[way]['errors'] or 'no errors'})"
            for way in ways
        )
    )
    return result


def _pages(
    stub: tasks_pb2_grpc.TaskServiceStub, request: tasks_pb2.ListTasksRequest, metadata: Any
) -> dict[str, Any]:
    """Every page of one listing: how many, how large, what failed."""
    pages, listed, sizes, errors = 0, 0, [], Counter[str]()
    while pages < 10 * max(request.page_size, 1):  # a bound, should a token never end
        try:
            page = stub.ListTasks(request, metadata=metadata, timeout=60)
        except grpc.RpcError as exc:
            errors[exc.code().name] += 1
            break
        pages += 1
        listed += len(page.tasks)
        sizes.append(page.ByteSize())
        if not page.next_page_token:
            break
        following = tasks_pb2.ListTasksRequest()
        following.CopyFrom(request)
        following.page_token = page.next_page_token
        request = following
    return {
        "pages": pages,
        "tasks_listed": listed,
        "bytes": sum(sizes),
        "largest_page_kib": round(max(sizes, default=0) / 1024, 1),
        "errors": dict(errors),
    }


def hostile_line(result: dict[str, Any]) -> str:
    """The phase as one paragraph of the report (the rows that ran)."""
    parts = [f"One token against the pool (etcd quota {result['quota_mib']} MiB)."]
    parts += [line(result[row]) for row, line in _ROW_LINES.items() if row in result]
    return " ".join(parts) + "\n"


def _writes_line(w: dict[str, Any]) -> str:
    return (
        f"Writes: {w['seconds']:.0f} s of one worker token offering {w['offered_mib_per_s']} "
        f"MiB/s; db peak {w['db_mib_peak']} MiB ({w['db_peak_over_quota']} of the quota), "
        f"{w['nospace_alarms']} NOSPACE readings; the pool {w['legit_cycles']} cycles, refused "
        f"{w['legit_refusals'] or 'never'}; the abuser {w['abuser']}."
    )


def _renewals_line(r: dict[str, Any]) -> str:
    return (
        f"Renewals: {r['flood_callers']} callers x 1,000 made-up fences for "
        f"{r['flood_seconds']} s; {r['lost']} of {r['claims_held']} claims lost (TTL "
        f"{r['ttl_s']:.0f} s), renew p99 {r['renew_p99_ms_idle']} ms idle, "
        f"{r['renew_p99_ms_flooded']} ms flooded ({r['renew_p99_over_ttl_third']} of TTL/3)."
    )


def _replays_line(p: dict[str, Any]) -> str:
    return (
        f"Replays: {p['replays_complete']} of {p['replays']} over {p['events']} events from "
        f"{p['tokens']} tokens, RSS +{p['rss_growth_mib_peak']} MiB at peak, "
        f"+{p['rss_growth_mib_after']} MiB after (refused {p['refusals'] or 'never'})."
    )


def _lists_line(ls: dict[str, Any]) -> str:
    lists = ", ".join(
        f"{way} {ls[way]['tasks_listed']}/{ls['tasks']} in {ls[way]['pages']} pages "
        f"(largest {ls[way]['largest_page_kib']} KiB, errors {ls[way]['errors'] or 'none'})"
        for way in ("queue", "queue_with_inputs", "state")
    )
    return f"Lists of {ls['tasks']} tasks of {ls['input_kib']} KiB: {lists}."


_ROW_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "writes": _writes_line,
    "renewals": _renewals_line,
    "replays": _replays_line,
    "lists": _lists_line,
}
