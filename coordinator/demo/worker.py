"""A demo worker process: claim, "work", commit, and report every step as one JSON line.

Run by ``coordinator demo`` (and the paused-worker test) as::

    python -m coordinator.demo.worker --target ADDR --principal NAME --queue Q [--hold-first S]

Each line on stdout is one JSON object with ``op`` (``started``, ``claim``, ``effect``,
``holding``, ``commit``, ``abandon``, ``error``, ``stopped``), ``worker``, and for task operations
``task``, ``attempt``, ``attempt_id``, ``generation``, ``outcome`` and ``reason``. With
``--outbox URL`` every claim first sends one pretend email through that outbox (``claim.effect``,
node ``notify``, slot ``email``) and reports an ``effect`` line; the payload names the worker,
so a takeover drafts a different payload for the same slot (PAYLOAD_CONFLICT, then reconcile).
With ``--hold-first`` the worker announces ``holding`` right after its first claim (and its
email) and then "works" for that long: the moment to SIGSTOP it. After SIGCONT it commits
regardless of what its keepalive noticed meanwhile, so the server (not the SDK) is seen
refusing the stale result; ``lost_before_commit`` tells what the SDK knew. ``WorkerProcess``
runs this module and collects those lines.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

import click

from coordinator import lifeline
from coordinator.errors import CoordinatorError
from coordinator.logging import configure_logging
from coordinator.sdk import Claim, ClaimLost, ClaimRefused, HttpDownstream, Outcome, WorkerClient

# Loopback: never route the demo's gRPC through an http_proxy from the environment.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]
# How long one ClaimNext waits for a task: short, so that a stop or the idle exit is seen soon.
_CLAIM_WAIT = timedelta(seconds=1)

Record = dict[str, Any]
"""One reported line, parsed."""

EFFECT_NODE, EFFECT_SLOT = "notify", "email"
"""The one side-effect slot every demo claim uses."""

_emit_lock = threading.Lock()


def emit(op: str, worker: str, **fields: Any) -> None:
    """Write one JSON line to stdout and flush it (the demo reads lines as they come)."""
    line = json.dumps({"op": op, "worker": worker, "t": round(time.time(), 3), **fields})
    with _emit_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def claim_fields(claim: Claim) -> dict[str, Any]:
    """The identity of a claim as it appears in every line about it."""
    return {
        "task": claim.task_id,
        "attempt": claim.attempt,
        "attempt_id": claim.fence.attempt_id,
        "generation": claim.generation,
    }


def effect_payload(task_id: str, worker: str) -> bytes:
    """The email a worker drafts for a task (it names the worker: drafts differ)."""
    return f"to: team@example.com\nsubject: {task_id} is done\n\ndrafted by {worker}".encode()


def send_effect(claim: Claim, worker: str, outbox: HttpDownstream) -> None:
    """Send the task's email through the outbox, at most once per task, and report it."""
    outcome = claim.effect(EFFECT_NODE, EFFECT_SLOT, effect_payload(claim.task_id, worker), outbox)
    emit(
        "effect",
        worker,
        **claim_fields(claim),
        status=outcome.status.value,
        effect_id=outcome.effect_id,
        conflict=outcome.conflict,
        sent=outcome.sent,
        recorded=outcome.recorded,
        external_ref=outcome.external_ref,
        payload_digest=outcome.payload_digest,
        outcome=outcome.outcome.name,
        message=outcome.message,
    )


def run_job(
    claim: Claim, worker: str, *, hold: float, work: float, outbox: HttpDownstream | None = None
) -> None:
    """Work on one claimed task (its email first, if there is an outbox) and commit it."""
    emit("claim", worker, **claim_fields(claim), outcome=Outcome.CLAIMED.name, reason="NONE")
    with claim:
        if outbox is not None:
            send_effect(claim, worker, outbox)
        if hold > 0:
            emit("holding", worker, **claim_fields(claim), pid=os.getpid())
            time.sleep(hold)  # the demo stops the process here, past its TTL
        else:
            try:
                claim.check()
            except ClaimLost as exc:
                emit("abandon", worker, **claim_fields(claim), message=str(exc))
                return
            claim.progress("working")
            time.sleep(work)
        lost_before = claim.is_lost()
        result = f"{claim.task_id} by {worker} attempt {claim.attempt}".encode()
        # Commit even when the keepalive already saw the loss: the store is the authority.
        outcome = claim.commit(result)
        emit(
            "commit",
            worker,
            **claim_fields(claim),
            outcome=outcome.outcome.name,
            reason=outcome.reason.name,
            message=outcome.message,
            lost_before_commit=lost_before,
            lost_reason=str(claim.lost_reason) if claim.lost_reason else "",
        )


def work_loop(
    client: WorkerClient,
    worker: str,
    *,
    queue: str,
    ttl: timedelta,
    hold_first: float,
    work: float,
    idle_exit: float,
    stop: threading.Event,
    outbox: HttpDownstream | None = None,
) -> None:
    """Claim and run tasks until stopped (or idle for ``idle_exit`` seconds, if set)."""
    held = hold_first <= 0
    idle_since = time.monotonic()
    while not stop.is_set():
        try:
            # A long poll: the server answers as soon as a task is ready, no sleep in between.
            claimed = client.claim_next(queue, ttl=ttl, wait=_CLAIM_WAIT)
        except CoordinatorError as exc:
            emit("error", worker, message=f"claim: {exc}")
            stop.wait(0.2)
            continue
        if isinstance(claimed, ClaimRefused):
            if claimed.outcome is not Outcome.NO_READY_TASK:
                emit("claim", worker, outcome=claimed.outcome.name, reason=claimed.reason.name)
            if idle_exit > 0 and time.monotonic() - idle_since > idle_exit:
                return
            if claimed.outcome is not Outcome.NO_READY_TASK:
                stop.wait(0.05)  # paused claims, a stale epoch: no busy loop
            continue
        try:
            run_job(claimed, worker, hold=0.0 if held else hold_first, work=work, outbox=outbox)
        except CoordinatorError as exc:
            emit("error", worker, **claim_fields(claimed), message=str(exc))
        held = True
        idle_since = time.monotonic()


class WorkerProcess:
    """Runs this module as a subprocess and collects the JSON lines it reports."""

    def __init__(
        self,
        name: str,
        target: str,
        *,
        queue: str,
        ttl: int,
        hold_first: float = 0.0,
        outbox: str = "",
    ) -> None:
        self.name = name
        self.records: list[Record] = []
        self._cond = threading.Condition()
        self._on_holding: Callable[[Record], None] | None = None
        args = ["--target", target, "--principal", name, "--queue", queue, "--ttl", str(ttl)]
        if hold_first:
            args += ["--hold-first", str(hold_first)]
        if outbox:
            args += ["--outbox", outbox]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator.demo.worker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        lifeline.kill_with_parent(self.proc.pid)  # even if the demo is SIGKILLed
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)

    def start(self, on_holding: Callable[[Record], None] | None = None) -> None:
        """Start reading its lines; ``on_holding`` runs on the reader thread, at once."""
        self._on_holding = on_holding
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("op") == "holding" and self._on_holding is not None:
                self._on_holding(record)  # before anyone else sees it: the process must stop now
            with self._cond:
                self.records.append(record)
                self._cond.notify_all()

    def wait_for(self, op: str, timeout: float, **match: Any) -> Record | None:
        """The first record with ``op`` (and the ``match`` fields), waiting up to ``timeout``."""

        def found() -> Record | None:
            for r in self.records:
                if r.get("op") == op and all(r.get(k) == v for k, v in match.items()):
                    return r
            return None

        with self._cond:
            self._cond.wait_for(lambda: found() is not None, timeout)
            return found()

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` if the process still runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """SIGCONT (in case it is frozen), SIGTERM, then SIGKILL after a grace period."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)


@click.command()
@click.option("--target", required=True, help="host:port of the coordinator.")
@click.option("--principal", required=True, help="The principal this worker acts as.")
@click.option("--queue", default="default", show_default=True)
@click.option("--ttl", type=click.IntRange(1, 3600), default=2, show_default=True)
@click.option(
    "--hold-first",
    type=click.FloatRange(0),
    default=0.0,
    help="Announce 'holding' after the first claim, then work on it this many seconds.",
)
@click.option("--work-ms", type=click.IntRange(0), default=50, show_default=True)
@click.option(
    "--idle-exit",
    type=click.FloatRange(0),
    default=0.0,
    help="Exit after this many seconds without a ready task (0: run until SIGTERM).",
)
@click.option("--outbox", default="", help="Send each task's email through this outbox URL.")
def main(
    target: str,
    principal: str,
    queue: str,
    ttl: int,
    hold_first: float,
    work_ms: int,
    idle_exit: float,
    outbox: str,
) -> None:
    """Run one demo worker until SIGTERM."""
    configure_logging("warning")  # stderr: stdout carries only the JSON report lines
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    emit("started", principal, pid=os.getpid())
    with WorkerClient(target, principal=principal, channel_options=CHANNEL_OPTIONS) as client:
        work_loop(
            client,
            principal,
            queue=queue,
            ttl=timedelta(seconds=ttl),
            hold_first=hold_first,
            work=work_ms / 1000,
            idle_exit=idle_exit,
            stop=stop,
            outbox=HttpDownstream(outbox, timeout=10.0) if outbox else None,
        )
    emit("stopped", principal)


if __name__ == "__main__":
    main()
