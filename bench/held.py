"""Held claims: what keeping N claims alive costs the coordinator and etcd (10k by default).

Agent pools hold claims for minutes to hours, so the steady load is renewals, not claim cycles.
On a freshly started coordinator, N tasks are seeded and claimed through the SDK by
``CLIENTS`` worker clients (as ``CLIENTS`` worker processes would; ``claim_many`` in batches),
with a TTL of 30 s; every claim then stays held for ``seconds`` while each client's one
keepalive loop renews it (at TTL/3, all of a client's claims due together in one RenewMany),
and on every renewal round a tenth of the claims move their progress marker (a claim whose
marker moved costs a write, one that did not a read-only compare).

The anchor, in the same run and before the claims: etcd's own keepalive of N leases of the
same TTL for the same time, one LeaseKeepAlive stream sending each lease's keepalive at TTL/3
(what etcd's clientv3 does), so ``etcd_ms_per_renewal_over_anchor`` says what a coordinator
renewal costs etcd next to a bare lease. Figures: renewals done / wanted (and claims lost),
the coordinator's CPU in cores, etcd's CPU per renewal, and the coordinator's memory.
"""

from __future__ import annotations

import contextlib
import queue
import random
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import etcd3
import grpc
from etcd3 import etcdrpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS, Meter, cpu_seconds, rss_mib
from bench.seed import TaskSeeder
from coordinator.sdk import Claim, ClaimRefused, WorkerClient

QUEUE = "held"
TTL = timedelta(seconds=30)
"""The claims' TTL (the smoke profile uses a short one, so a few seconds see renewals)."""
CLIENTS = 10
CLAIM_BATCH = 64
MOVING = 0.1
"""The share of claims whose progress marker moves every renewal interval."""


UNDER_A_TICK = "etcd spent less than one clock tick of CPU on the anchor: nothing to divide by"
"""Why the etcd ratio is null when its anchor window was too short to measure."""


def run_held(
    target: str,
    seeder: TaskSeeder,
    meter: Meter,
    etcd: tuple[str, int],
    *,
    count: int,
    seconds: float,
    ttl: timedelta = TTL,
) -> dict[str, Any]:
    """The anchor (on etcd at ``etcd``, host and port), then ``count`` claims of ``ttl`` held
    for ``seconds``; the figures."""
    anchor = _anchor(etcd, meter, count=count, seconds=seconds, ttl=ttl)
    pid = meter.coordinator_pid
    fresh = rss_mib(pid)
    seeder.seed(QUEUE, count)
    meter.settle(limit=30)
    with ExitStack() as stack:
        clients = [
            stack.enter_context(
                WorkerClient(target, principal=f"bench-holder-{i}", channel_options=GRPC_OPTIONS)
            )
            for i in range(CLIENTS)
        ]
        started = time.monotonic()
        held = _claim_all(clients, count, stack, ttl)
        claim_s = time.monotonic() - started
        hold = _hold(held, meter, seconds, ttl)
    result = {
        "claims_held": len(held),
        "clients": CLIENTS,
        "claim_s": round(claim_s, 1),
        "seconds": seconds,
        "ttl_s": ttl.total_seconds(),
        **hold,
        **anchor,
        "coordinator_rss_mib_fresh": round(fresh, 1),
        "coordinator_rss_mib_held": hold.pop("rss_mib"),
        "coordinator_hwm_mib": round(rss_mib(pid, "VmHWM"), 1),
    }
    ms, anchor_ms = result["etcd_ms_per_renewal"], result["anchor_etcd_ms_per_keepalive"]
    result["etcd_ms_per_renewal_over_anchor"] = (
        round(ms / anchor_ms, 2) if ms is not None and anchor_ms else None
    )
    if ms is None:
        result["etcd_ratio_unmeasured"] = "no renewal in the held window"
    elif not anchor_ms:
        # etcd's CPU is read in clock ticks (10 ms): a short anchor on a small count can spend
        # less than one, and there is nothing to divide by (the smoke profile's 100 leases, 3 s).
        result["etcd_ratio_unmeasured"] = UNDER_A_TICK
    say(
        f"held: {len(held)} claims for {seconds:.0f}s, renewals on time "
        f"{result['renewals_on_time_ratio']}, {result['lost']} lost, coordinator "
        f"{result['coordinator_cpu_cores']} cores, etcd {ms} ms/renewal "
        f"({result['etcd_ms_per_renewal_over_anchor']}x a bare lease keepalive)"
    )
    return result


def _claim_all(
    clients: list[WorkerClient], count: int, stack: ExitStack, ttl: timedelta
) -> list[Claim]:
    """Claim every seeded task, the clients taking turns, and start each claim's keepalive."""
    held: list[Claim] = []
    lock = threading.Lock()

    def claim(client: WorkerClient) -> None:
        while True:
            got = client.claim_many(QUEUE, ttl=ttl, max_tasks=CLAIM_BATCH)
            if isinstance(got, ClaimRefused):
                return
            with lock:
                held.extend(stack.enter_context(c) for c in got)
                if len(held) >= count:
                    return

    # Daemons: a phase cut off at the bench's time bound must not hold its exit.
    threads = [threading.Thread(target=claim, args=(c,), daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return held


def _hold(held: list[Claim], meter: Meter, seconds: float, ttl: timedelta) -> dict[str, Any]:
    """Let the keepalive loops renew ``held`` for ``seconds``, a tenth of the markers moving
    every interval; renewals, losses and CPU over that window."""
    interval = ttl.total_seconds() / 3
    stop = threading.Event()
    rng = random.Random(7)

    def move_markers() -> None:
        step = 0
        while not stop.wait(interval):
            step += 1
            for claim in rng.sample(held, max(1, int(len(held) * MOVING))):
                claim.progress(f"step-{step}")

    before = sum(c.renewals for c in held)
    cpu = meter.snapshot()
    started = time.monotonic()
    mover = threading.Thread(target=move_markers, daemon=True)
    mover.start()
    stop.wait(seconds)
    stop.set()
    elapsed = time.monotonic() - started
    spent = meter.snapshot() - cpu
    done = sum(c.renewals for c in held) - before
    wanted = len(held) * elapsed / interval
    rss = round(rss_mib(meter.coordinator_pid), 1)
    return {
        "renewals": done,
        "renewals_wanted": round(wanted),
        "renewals_on_time_ratio": round(done / wanted, 3) if wanted else None,
        "lost": sum(1 for c in held if c.is_lost()),
        "coordinator_cpu_cores": round(spent.coordinator / elapsed, 3),
        "client_cpu_cores": round(spent.client / elapsed, 3),
        "etcd_cpu_cores": round(spent.etcd / elapsed, 3),
        "etcd_ms_per_renewal": round(1000 * spent.etcd / done, 4) if done else None,
        "coordinator_ms_per_renewal": round(1000 * spent.coordinator / done, 4) if done else None,
        "rss_mib": rss,
    }


def _anchor(
    etcd: tuple[str, int], meter: Meter, *, count: int, seconds: float, ttl: timedelta
) -> dict[str, Any]:
    """etcd's own keepalive of ``count`` leases for ``seconds``: one stream, each lease's
    keepalive at TTL/3, spread over the interval; etcd's CPU per keepalive."""
    client = etcd3.client(*etcd, timeout=60, grpc_options=GRPC_OPTIONS)
    leases = [client.lease(int(ttl.total_seconds())).id for _ in range(count)]
    interval = ttl.total_seconds() / 3
    requests: queue.Queue[Any] = queue.Queue()
    stop = threading.Event()
    answered = [0]

    def feed() -> Iterator[Any]:
        while (item := requests.get()) is not None:
            yield item

    def send() -> None:
        while not stop.is_set():
            round_started = time.monotonic()
            for i, lease in enumerate(leases):
                due = round_started + interval * i / len(leases)
                if stop.wait(max(due - time.monotonic(), 0.0)):
                    return
                requests.put(etcdrpc.LeaseKeepAliveRequest(ID=lease))
            stop.wait(max(round_started + interval - time.monotonic(), 0.0))

    # The generated stub, as etcd's own client keeps leases alive: one stream for all of them.
    stream = client.leasestub.LeaseKeepAlive(feed())

    def read() -> None:
        with contextlib.suppress(grpc.RpcError):  # CANCELLED once the anchor is over
            for _ in stream:
                answered[0] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    meter.settle(limit=10)
    etcd_before = cpu_seconds(meter.etcd_pid)
    started = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    stop.wait(seconds)
    stop.set()
    sender.join()
    elapsed = time.monotonic() - started
    spent = cpu_seconds(meter.etcd_pid) - etcd_before
    done = answered[0]
    requests.put(None)
    stream.cancel()
    for lease in leases:
        client.revoke_lease(lease)
    client.close()
    return {
        "anchor_keepalives": done,
        "anchor_seconds": round(elapsed, 1),
        "anchor_etcd_ms_per_keepalive": round(1000 * spent / done, 4) if done else None,
    }
