"""Callers that abandon their long polls, for the ``long-poll-cancel`` scenario.

While the producer creates tasks and the workers claim them, a few callers long-poll the run's
queue (ClaimNext, ``wait_seconds`` 10) and leave each poll at a random moment: half by a short
client deadline, half by cancelling the call. They stand in line with the workers, so tasks
arrive while they wait, while they are about to leave and while they leave. Each poll is
recorded (``OpKind.CLAIM`` with its request id): ``info`` with reason ``abandoned`` when the
caller left first; CLAIMED when the answer reached it first, and then the task is done at once
(committed, recorded like a worker's commit), since a delivered claim is an attempt like any
other; NO_READY_TASK and refusals as the workers record them.

What the server must do (chaos/delivery_check.py holds it to it): an abandoned poll claims
nothing, or gives back what it claimed uncounted (``give_back``); no task is left CLAIMED by a
caller that is gone; every task is still done exactly once (the checker's usual rules).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import grpc

from chaos.fault import Fault
from chaos.harness import Harness
from chaos.history import ABANDONED, End, Observed, OpKind, Recorder
from coordinator import request_ids
from coordinator.domain.digests import digest_of
from coordinator.domain.states import FenceReason, Outcome
from coordinator.v1 import types_pb2, worker_pb2, worker_pb2_grpc

Metadata = tuple[tuple[str, str | bytes], ...]

WAIT_SECONDS = 10.0
"""How long each poll asks the server to wait: longer than any caller stays."""
STAY = (0.02, 0.6)
"""Seconds a caller stays in a poll before it leaves (uniform)."""
LEFT = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED})


class Abandoners:
    """``count`` callers, each long-polling and leaving its polls until ``stop()``."""

    def __init__(
        self,
        channel: grpc.Channel,
        queue: str,
        metadata: Callable[[str], Metadata],
        rec: Recorder,
        *,
        epoch: int,
        count: int,
        seed: int,
    ) -> None:
        self._stub = worker_pb2_grpc.WorkerServiceStub(channel)
        self._queue = queue
        self._metadata = metadata
        self._rec = rec
        self._epoch = epoch
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._caller, args=(f"abandon-{n}", random.Random(seed + n)), daemon=True
            )
            for n in range(count)
        ]

    def start(self) -> Abandoners:
        """Start every caller."""
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop after each caller's current poll (and the commit of a task it got)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(30)

    def _caller(self, name: str, rng: random.Random) -> None:
        while not self._stopping.is_set():
            answer = self._poll(name, rng)
            if answer is not None:
                self._commit(name, answer)

    def _poll(self, name: str, rng: random.Random) -> worker_pb2.ClaimResponse | None:
        """One poll, left at a random moment; the claim if its answer came first."""
        request = worker_pb2.ClaimNextRequest(
            queue=self._queue, scheduler_epoch=self._epoch, ttl_seconds=2, wait_seconds=WAIT_SECONDS
        )
        stay, by_deadline = rng.uniform(*STAY), rng.random() < 0.5
        op = self._rec.invoke(OpKind.CLAIM, task="")
        with self._rec.bound(op) as request_id:
            metadata = (*self._metadata(name), (request_ids.METADATA_KEY, request_id))
            call = self._stub.ClaimNext.future(
                request, metadata=metadata, timeout=stay if by_deadline else 30.0
            )
        if not by_deadline and not self._stopping.wait(stay):
            call.cancel()  # type: ignore[no-untyped-call]  # untyped in the stubs
        try:
            answer = call.result()
        except grpc.FutureCancelledError:  # our cancel came first
            self._rec.complete(op, End.INFO, reason=ABANDONED)
            return None
        except grpc.RpcError as exc:
            code = exc.code()
            self._rec.complete(op, End.INFO, reason=ABANDONED if code in LEFT else str(code))
            self._stopping.wait(0.05)
            return None
        if answer.outcome != types_pb2.OUTCOME_CLAIMED:
            self._rec.complete(op, End.FAIL, Observed[Outcome(answer.outcome).name])
            return None
        self._rec.complete(op, End.OK, Observed.CLAIMED, **_fields(answer))
        return answer

    def _commit(self, name: str, claim: worker_pb2.ClaimResponse) -> None:
        """The task a poll was answered with, done at once (it reached its caller)."""
        result = f"{claim.fence.task_id} attempt {claim.fence.attempt_id}".encode()
        request = worker_pb2.CommitRequest(
            fence=claim.fence,
            input_digest=claim.input_digest,
            result=result,
            result_digest=digest_of(result),
        )
        op = self._rec.invoke(OpKind.COMMIT, **_fields(claim))
        with self._rec.bound(op) as request_id:
            metadata = (*self._metadata(name), (request_ids.METADATA_KEY, request_id))
            try:
                got = self._stub.Commit(request, metadata=metadata, timeout=10)
            except grpc.RpcError as exc:
                self._rec.complete(op, End.INFO, reason=str(exc.code()))
                return
        outcome = Observed[Outcome(got.outcome).name]
        self._rec.complete(op, End.OK, outcome, reason=FenceReason(got.reason).name)


def _fields(claim: worker_pb2.ClaimResponse) -> dict[str, object]:
    """The recorded fields of a claim, as chaos/worker.py records its own."""
    return {
        "task": claim.fence.task_id,
        "attempt": claim.attempt,
        "attempt_id": claim.fence.attempt_id,
        "generation": claim.fence.claim_generation,
        "revision": claim.task_revision,
    }


class AbandonPolls(Fault):
    """The ``long-poll-cancel`` scenario's fault: ``CALLERS`` callers long-poll the run's queue
    beside the workers and leave each poll at a random moment, for ``SECONDS`` while the
    producer creates tasks. Expected: every task done once (the usual rules), and no attempt
    counted that nobody received but the ones lost in flight (chaos/delivery_check.py)."""

    name = "long-poll-cancel"
    CALLERS, SECONDS, SEED = 4, 3.0, 11

    def __init__(self) -> None:
        self.callers: Abandoners | None = None
        self.channel: grpc.Channel | None = None

    def inject(self, h: Harness) -> None:
        with h.client("abandon") as client:
            epoch = client.epoch()
        self.channel = h.channel()
        rec = h.recorder("abandon")
        self.callers = Abandoners(
            self.channel,
            h.queue,
            h.metadata,
            rec,
            epoch=epoch,
            count=self.CALLERS,
            seed=self.SEED,
        ).start()
        time.sleep(self.SECONDS)  # tasks arrive while the callers come and go

    def heal(self, h: Harness) -> None:
        if self.callers is not None:
            self.callers.stop()
        if self.channel is not None:
            self.channel.close()
