"""A hostile tenant for the ``hostile-tenant`` scenario: one worker token that floods writes
and renewals while the normal pool runs.

The tenant holds one claim of its own (a task of the run's queue it created) and, for
``FLOOD_SECONDS``, sends as fast as it can RenewMany calls that carry a new 64 KiB checkpoint
for its claim and 99 made-up fences, and StageResult calls of 256 KiB. The replicas run with a
small worker write budget (``replica_flags``), so past its first burst every checkpoint must
come back not kept (``checkpoint_refused``) while the renewal itself is OK, and every staging
must be refused RESOURCE_EXHAUSTED; anything else stops the run. The run's checker then holds
the normal pool to its usual rules: no violation, every task done once, no claim lost.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

import grpc

from chaos.fault import Fault
from chaos.harness import Harness
from coordinator.domain.digests import digest_of
from coordinator.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    tasks_pb2,
    tasks_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)

CHECKPOINT = 64 << 10
STAGED = 256 << 10
INPUT = b"hostile"
TRIES = 20
MADE_UP = 99
"""Fences in each RenewMany that name no claim (the flood's share of renewals; the issue's
1,000-fence flood is the fairness item's scenario, not this one's)."""


class HostileTenant(Fault):
    """One token floods checkpoints, staged results and made-up renewals (module docstring)."""

    name = "hostile-tenant"
    BUDGET = 64 << 10  # bytes/s of a worker token, over a 2 s window: a 128 KiB burst
    replica_flags = (
        *("--write-budget-worker", str(BUDGET)),
        *("--write-budget-window", "2"),
    )
    local_only = "it is sized to the local replicas' write budget"
    FLOOD_SECONDS = 3.0

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def inject(self, h: Harness) -> None:
        channel = h.channel()
        try:
            worker = worker_pb2_grpc.WorkerServiceStub(channel)
            fence = self._claim(h, channel)
            self._flood(worker, fence, h)
            commit = worker_pb2.CommitRequest(
                fence=fence,
                input_digest=digest_of(INPUT),
                result=b"done",
                result_digest=digest_of(b"done"),
            )
            worker.Commit(commit, metadata=self._metadata(h))  # its task ends, as any
        finally:
            channel.close()
        if self.counts["checkpoint_refused"] < 1 or self.counts["staging_refused"] < 1:
            raise AssertionError(f"the hostile tenant was never held back: {dict(self.counts)}")

    def _metadata(self, h: Harness) -> tuple[tuple[str, str | bytes], ...]:
        # Insecure replicas give a caller that names no roles all of them (admin: no budget).
        return (*h.metadata("hostile"), ("x-coordinator-roles", "worker"))

    def _claim(self, h: Harness, channel: grpc.Channel) -> types_pb2.Fence:
        """A claim of a task of the run's queue (the follower and the checker see all of it):
        created and claimed at once, again while a worker of the pool wins the race for it
        (the pool then does that task as any other)."""
        tasks = tasks_pb2_grpc.TaskServiceStub(channel)
        worker = worker_pb2_grpc.WorkerServiceStub(channel)
        epoch = admin_pb2_grpc.AdminServiceStub(channel).GetEpoch(
            admin_pb2.GetEpochRequest(), metadata=h.metadata("operator")
        )
        for _ in range(TRIES):
            task_id = f"hostile-{uuid.uuid4().hex[:8]}"
            created = tasks_pb2.CreateTaskRequest(
                task_id=task_id, input=INPUT, input_digest=digest_of(INPUT), queue=h.queue
            )
            tasks.CreateTask(created, metadata=h.metadata("operator"))
            request = worker_pb2.ClaimRequest(
                task_id=task_id, scheduler_epoch=epoch.epoch, ttl_seconds=30
            )
            claim = worker.Claim(request, metadata=self._metadata(h))
            if claim.outcome == types_pb2.OUTCOME_CLAIMED:
                return claim.fence
        raise AssertionError(f"the pool won all {TRIES} of the hostile tenant's own tasks")

    def _flood(
        self, worker: worker_pb2_grpc.WorkerServiceStub, fence: types_pb2.Fence, h: Harness
    ) -> None:
        made_up = [
            worker_pb2.RenewRequest(
                fence=types_pb2.Fence(
                    task_id=f"made-up-{i}", attempt_id="a1-0", claim_generation=1, scheduler_epoch=1
                )
            )
            for i in range(MADE_UP)
        ]
        until, n = time.monotonic() + self.FLOOD_SECONDS, 0
        while time.monotonic() < until:
            n += 1
            own = worker_pb2.RenewRequest(
                fence=fence, checkpoint=n.to_bytes(4, "big") * (CHECKPOINT // 4)
            )
            try:
                many = worker.RenewMany(
                    worker_pb2.RenewManyRequest(renewals=[own, *made_up]),
                    metadata=self._metadata(h),
                )
            except grpc.RpcError as exc:
                # Past its renewal rate the flooder is refused whole (renew_rate_per_principal):
                # the throttle working; its own claim is renewed by a later call in time.
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.counts["renewals_throttled"] += 1
                time.sleep(0.05)
                continue
            answer = many.results[0].renewal
            if answer.outcome != types_pb2.OUTCOME_OK:  # the flood must not cost its own claim
                raise AssertionError(f"the hostile tenant's renewal failed: {answer.message}")
            self.counts[
                "checkpoint_refused" if answer.checkpoint_refused else "checkpoint_kept"
            ] += 1
            result = n.to_bytes(4, "big") * (STAGED // 4)
            stage = worker_pb2.StageResultRequest(
                fence=fence, result=result, result_digest=digest_of(result)
            )
            try:
                worker.StageResult(stage, metadata=self._metadata(h))
                self.counts["staged"] += 1
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                self.counts["staging_refused"] += 1
