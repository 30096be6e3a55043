"""Issue 25's second row at full size: ``callers`` threads of one worker token flood RenewMany
with 1,000 made-up fences each (bench/hostile_flood.py, a process of its own) while a normal SDK
client holds ``claims`` claims of TTL 6 s (its keepalive renews them at TTL/3, batched).

The SDK's own RenewMany calls are timed by a client interceptor (what the keepalive waited,
not a probe beside it), idle first, then under the flood. Figures: claims lost (the target:
none), renew p99 idle and flooded and the flooded p99 over TTL/3 (the target: below 1), the
renewals done over those wanted, and what the flood got back (its calls by status code).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

import grpc

from bench.harness import say
from bench.procs import GRPC_OPTIONS
from bench.seed import TaskSeeder
from bench.stats import ms, percentile
from coordinator import lifeline
from coordinator.sdk import Claim, ClaimRefused, WorkerClient

QUEUE = "renewed"
TTL = timedelta(seconds=6)
CLAIM_BATCH = 64
IDLE = 6.0
"""Seconds the claims are renewed before the flood (three renewal rounds: the idle spread)."""


class RenewTimer(grpc.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Keeps the duration of every RenewMany sent through it, by phase (``phase`` names the
    list the next ones go to)."""

    def __init__(self) -> None:
        self.phase = "idle"
        self.took: dict[str, list[float]] = {"idle": [], "flooded": [], "after": []}
        self._lock = threading.Lock()

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        """Time the call when it is a RenewMany (the SDK's keepalive sends it blocking)."""
        started = time.perf_counter()
        outcome = continuation(details, request)
        if str(details.method).endswith("/RenewMany"):
            with self._lock:
                self.took[self.phase].append(time.perf_counter() - started)
        return outcome


class Flood:
    """bench/hostile_flood.py in a child process tied to the bench's life; ``stop()`` ends it
    and returns its calls' status codes."""

    def __init__(self, target: str, callers: int) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.hostile_flood", target, str(callers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        lifeline.kill_with_parent(self._proc.pid)

    def stop(self) -> dict[str, int]:
        """Close its stdin (its signal to stop) and read what it printed."""
        out, _ = self._proc.communicate(input="", timeout=60)
        lifeline.spare(self._proc.pid)
        codes: dict[str, int] = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        return codes


def _claim_all(client: WorkerClient, count: int, stack: ExitStack) -> list[Claim]:
    held: list[Claim] = []
    while len(held) < count:
        got = client.claim_many(QUEUE, ttl=TTL, max_tasks=min(CLAIM_BATCH, count - len(held)))
        if isinstance(got, ClaimRefused):
            break
        held.extend(stack.enter_context(c) for c in got)
    return held


def run_renewals(
    target: str, seeder: TaskSeeder, *, claims: int, callers: int, seconds: float
) -> dict[str, Any]:
    """The row against the coordinator at ``target`` (``seeder`` writes its keyspace)."""
    seeder.seed(QUEUE, claims)
    timer = RenewTimer()
    with ExitStack() as stack:
        client = stack.enter_context(
            WorkerClient(
                target, principal="legit-pool", channel_options=GRPC_OPTIONS, interceptors=[timer]
            )
        )
        held = _claim_all(client, claims, stack)
        time.sleep(IDLE)
        before = sum(c.renewals for c in held)
        timer.phase = "flooded"
        flood = Flood(target, callers)
        started = time.monotonic()
        try:
            time.sleep(seconds)
        finally:
            codes = flood.stop()
        elapsed = time.monotonic() - started
        timer.phase = "after"
        done = sum(c.renewals for c in held) - before
        lost = sum(1 for c in held if c.is_lost())
    return _figures(timer, len(held), lost, done, elapsed, callers, codes)


def _figures(
    timer: RenewTimer,
    held: int,
    lost: int,
    done: int,
    elapsed: float,
    callers: int,
    codes: dict[str, int],
) -> dict[str, Any]:
    third = TTL.total_seconds() / 3
    idle, flooded = (percentile(timer.took[k], 99) for k in ("idle", "flooded"))
    wanted = held * elapsed / third
    result = {
        "claims_held": held,
        "ttl_s": TTL.total_seconds(),
        "flood_callers": callers,
        "flood_seconds": round(elapsed, 1),
        "flood_calls": codes,
        "lost": lost,
        "renew_calls_timed": {k: len(v) for k, v in timer.took.items()},
        "renew_p99_ms_idle": ms(idle),
        "renew_p99_ms_flooded": ms(flooded),
        "renew_p99_over_ttl_third": None if flooded is None else round(flooded / third, 3),
        "renewals_on_time_ratio": round(done / wanted, 3) if wanted else None,
    }
    say(
        f"hostile renewals: {callers} flooders for {elapsed:.0f}s ({codes}); {lost} of {held} "
        f"claims lost, renew p99 {result['renew_p99_ms_idle']} ms idle, "
        f"{result['renew_p99_ms_flooded']} ms flooded "
        f"({result['renew_p99_over_ttl_third']} of TTL/3)"
    )
    return result
