"""A chaos worker process: claims, sends one effect, commits, and records every operation.

    python -m chaos.worker --target ADDR --name W --history FILE [--outbox URL] [--pause-first]
                           [--kill-after-effect] [--retry-commits] [--poison TASK_ID]

Each claim, effect and commit is recorded twice in the JSONL history (chaos/history.py): at
invocation and at completion; a call that raised a transport error is recorded ``info``.
``--pause-first`` stops this process (SIGSTOP to itself) while it holds its first claim, right
after its downstream call: the PauseWorker fault resumes it past its TTL, and it then commits
anyway, so the store (not the SDK) must refuse the late result. ``--kill-after-effect`` SIGKILLs
itself right after its first downstream call (the response never reaches the coordinator).
``--retry-commits`` sends every commit twice (a duplicated / retried request). ``--hold-first``
works on its first claim until SIGUSR1 (at most ``HOLD_LIMIT`` seconds): the partition fault cuts
it off meanwhile and signals it once the link is back, so its commit comes after the partition.
``--poison TASK_ID`` makes that task a poison task: the worker that claims it dies, SIGSTOPped
on its first attempt (the PoisonTask fault resumes it once the task is FAILED, and it commits
anyway: the store must refuse it) and SIGKILLed on every other.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import FrameType

import click

from chaos.history import End, Observed, OpKind, Recorder
from coordinator.errors import CoordinatorError
from coordinator.logging import configure_logging
from coordinator.sdk import (
    Claim,
    ClaimRefused,
    EffectStatus,
    FenceReason,
    HttpDownstream,
    OutcomeUnknown,
    TransportError,
    WorkerClient,
    tls_credentials,
)

CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]
EFFECT_NODE, EFFECT_SLOT = "notify", "email"
HOLD_LIMIT = 120.0
UNREACHED_TRIES, UNREACHED_PAUSE = 20, 0.25  # a commit that reached no server: 5 s of tries


def _claim_fields(claim: Claim) -> dict[str, object]:
    return {
        "task": claim.task_id,
        "attempt": claim.attempt,
        "attempt_id": claim.fence.attempt_id,
        "generation": claim.generation,
        "revision": claim.task_revision,
    }


class ChaosWorker:
    """The claim -> effect -> commit loop of one worker, recording as it goes."""

    def __init__(self, client: WorkerClient, rec: Recorder, **options: object) -> None:
        self.client, self.rec = client, rec
        self.queue = str(options["queue"])
        self.ttl = timedelta(seconds=int(str(options["ttl"])))
        self.outbox = (
            HttpDownstream(str(options["outbox"]), timeout=5.0) if options["outbox"] else None
        )
        self.pause_first = bool(options["pause_first"])
        self.kill_after_effect = bool(options["kill_after_effect"])
        self.retry_commits = bool(options["retry_commits"])
        self.work = int(str(options["work_ms"])) / 1000
        self.hold_first = bool(options["hold_first"])
        self.poison = str(options["poison"])
        self.released = threading.Event()  # set by SIGUSR1: the held first claim may commit
        self.claims = 0

    def claim(self) -> Claim | None:
        """One ClaimNext, recorded; a claim or None (nothing ready, refused, or unknown)."""
        op = self.rec.invoke(OpKind.CLAIM, task="")
        try:
            with self.rec.bound(op):
                got = self.client.claim_next(self.queue, ttl=self.ttl)
        except CoordinatorError as exc:
            self.rec.complete(op, End.INFO, message=str(exc)[:200])
            return None
        if isinstance(got, ClaimRefused):
            self.rec.complete(op, End.FAIL, Observed[got.outcome.name], reason=got.reason.name)
            if got.reason is FenceReason.EPOCH_CHANGED:
                self.client.epoch()  # an operator bumped the epoch: join the new one
            return None
        self.rec.complete(op, End.OK, Observed.CLAIMED, **_claim_fields(got))
        return got

    def effect(self, claim: Claim) -> None:
        """The task's one email, through the outbox, recorded."""
        assert self.outbox is not None
        # The effect key comes with the answer (it names the task's incarnation, which a worker
        # does not know): an indefinite call is settled by its request id among its task's
        # effect writes (chaos/linearizability.py), and each task has this one slot.
        op = self.rec.invoke(OpKind.EFFECT, **_claim_fields(claim))
        payload = f"task {claim.task_id} is done".encode()  # the same draft from every attempt
        try:
            with self.rec.bound(op):
                got = claim.effect(EFFECT_NODE, EFFECT_SLOT, payload, self.outbox)
        except CoordinatorError as exc:
            self.rec.complete(op, End.INFO, message=str(exc)[:200])
            return
        end = End.INFO if got.status is EffectStatus.UNCERTAIN else End.OK
        self.rec.complete(
            op, end, Observed[got.status.name], reason=got.reason.name, effect_key=got.effect_id
        )

    def commit(self, claim: Claim) -> None:
        """Commit (twice with ``--retry-commits``), recorded; transport errors are ``info``.

        A commit none of whose tries reached the server (TransportError, not OutcomeUnknown)
        is sent again, as an agent would, up to ``UNREACHED_TRIES`` times: past its lease the
        SDK tries once, and a channel still in its reconnect backoff after a partition heals
        fails that try at once, so the late commit the fault exists for would never be sent.
        """
        result = f"{claim.task_id} attempt {claim.fence.attempt_id}".encode()
        for _ in range(2 if self.retry_commits else 1):
            for _ in range(UNREACHED_TRIES):
                if self._commit_once(claim, result):
                    break
                time.sleep(UNREACHED_PAUSE)

    def _commit_once(self, claim: Claim, result: bytes) -> bool:
        """One recorded commit; False when it did not reach the server."""
        op = self.rec.invoke(OpKind.COMMIT, **_claim_fields(claim))
        try:
            with self.rec.bound(op):
                got = claim.commit(result)
        except CoordinatorError as exc:
            self.rec.complete(op, End.INFO, message=str(exc)[:200])
            return not isinstance(exc, TransportError) or isinstance(exc, OutcomeUnknown)
        self.rec.complete(op, End.OK, Observed[got.outcome.name], reason=got.reason.name)
        return True

    def run_one(self, claim: Claim) -> None:
        """Work one claimed task to its commit (the faults this worker was told to act out)."""
        first = self.claims == 0
        self.claims += 1
        with claim:
            if self.poison and claim.task_id == self.poison:
                os.kill(os.getpid(), signal.SIGSTOP if claim.attempt == 1 else signal.SIGKILL)
                self.commit(claim)  # resumed from SIGSTOP, long past its lease
                return
            if self.outbox is not None:
                self.effect(claim)
            if first and self.kill_after_effect:
                os.kill(os.getpid(), signal.SIGKILL)
            if first and self.pause_first:
                os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the PauseWorker fault
            elif first and self.hold_first:
                self.released.wait(HOLD_LIMIT)  # long work: cut off meanwhile
            elif self.work:
                threading.Event().wait(self.work)  # "work": commits stay in flight meanwhile
            self.commit(claim)

    def loop(self, stop: threading.Event) -> None:
        """Claim and work until stopped."""
        while not stop.is_set():
            claim = self.claim()
            if claim is None:
                stop.wait(0.05)
                continue
            try:
                self.run_one(claim)
            except CoordinatorError:
                stop.wait(0.05)  # recorded already where it matters; the lease expires


@click.command()
@click.option("--target", required=True)
@click.option("--name", required=True)
@click.option("--history", required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--queue", default="chaos", show_default=True)
@click.option("--ttl", type=click.IntRange(1, 60), default=2, show_default=True)
@click.option("--outbox", default="")
@click.option("--token", default="", help="Bearer token (a deployed coordinator).")
@click.option("--ca", default="", help="PEM CA of a deployed coordinator's TLS certificate.")
@click.option("--cert", default="", help="PEM client certificate (mutual TLS, with --key).")
@click.option("--key", default="", help="PEM key of --cert.")
@click.option("--pause-first", is_flag=True)
@click.option("--kill-after-effect", is_flag=True)
@click.option("--retry-commits", is_flag=True)
@click.option("--work-ms", type=click.IntRange(0), default=30, show_default=True)
@click.option("--hold-first", is_flag=True, help="Work on the first claim until SIGUSR1.")
@click.option("--poison", default="", metavar="TASK_ID", help="Die on every attempt of it.")
def main(
    target: str,
    name: str,
    history: Path,
    token: str,
    ca: str,
    cert: str,
    key: str,
    **options: object,
) -> None:
    """Run one chaos worker until SIGTERM."""
    configure_logging("error")
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    rec = Recorder(history, name)
    try:
        credentials = tls_credentials(ca=ca, cert=cert or None, key=key or None) if ca else None
        with WorkerClient(
            target,
            principal=name,
            channel_options=CHANNEL_OPTIONS,
            token=token or None,
            credentials=credentials,
        ) as client:
            worker = ChaosWorker(client, rec, **options)
            signal.signal(signal.SIGUSR1, lambda signum, frame: worker.released.set())
            worker.loop(stop)
    finally:
        rec.close()


if __name__ == "__main__":
    main()
