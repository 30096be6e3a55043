"""Item 3 (memory): the coordinator's RSS while it has N claims held at once (10k by default).

Run against a freshly started coordinator, so the figure is its baseline plus what the claims
cost, not what earlier phases left in its heap. N tasks are seeded, then a few worker threads
claim them all with a long TTL and hold them (no keepalive needed: the TTL outlasts the
measurement); VmRSS and VmHWM of the coordinator process are read once it is idle.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from bench.harness import say
from bench.procs import GRPC_OPTIONS, Meter, rss_mib
from bench.seed import TaskSeeder
from coordinator.sdk import Claim, ClaimRefused, WorkerClient

QUEUE = "held"
TTL = timedelta(seconds=600)
_THREADS = 8


def run_held(target: str, seeder: TaskSeeder, meter: Meter, *, count: int) -> dict[str, Any]:
    """Claim ``count`` tasks and hold them; the coordinator's memory before and after."""
    pid = meter.coordinator_pid
    fresh = rss_mib(pid)
    seeder.seed(QUEUE, count)
    meter.settle(limit=30)
    seeded = rss_mib(pid)
    held: list[Claim] = []
    refused: list[str] = []
    lock = threading.Lock()
    started = time.monotonic()

    def claim_all(principal: str) -> None:
        with WorkerClient(target, principal=principal, channel_options=GRPC_OPTIONS) as client:
            while True:
                claim = client.claim_next(QUEUE, ttl=TTL)
                with lock:
                    if isinstance(claim, ClaimRefused):
                        refused.append(claim.outcome.name)
                        return
                    held.append(claim)

    threads = [
        threading.Thread(target=claim_all, args=(f"bench-holder-{i}",)) for i in range(_THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    claimed_in = time.monotonic() - started
    meter.settle(limit=30)
    result = {
        "claims_held": len(held),
        "claim_s": round(claimed_in, 1),
        "refusals_at_end": sorted(set(refused)),
        "coordinator_rss_mib_fresh": round(fresh, 1),
        "coordinator_rss_mib_seeded": round(seeded, 1),
        "coordinator_rss_mib_held": round(rss_mib(pid), 1),
        "coordinator_hwm_mib": round(rss_mib(pid, "VmHWM"), 1),
    }
    say(f"held: {len(held)} claims, coordinator RSS {result['coordinator_rss_mib_held']} MiB")
    return result
