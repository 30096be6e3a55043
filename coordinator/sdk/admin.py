"""AdminCalls: an operator's calls (AdminService), apart from the worker's and producer's.

A ``WorkerClient``'s ``admin`` is this facade over the same connection, principal and retries:

    with WorkerClient(target, principal="ops") as client:
        client.admin.bump_epoch()

Kept off ``WorkerClient`` itself so a worker's surface holds only what a worker calls; the
server still decides who may call these (the admin role, docs/security.md).
"""

from __future__ import annotations

from coordinator.domain.effects import EffectState
from coordinator.sdk._rpc import Rpc
from coordinator.sdk.effects import EffectInfo
from coordinator.sdk.tasks import TaskInfo
from coordinator.v1 import admin_pb2, types_pb2


class AdminCalls:
    """The AdminService calls of one client's connection (``WorkerClient.admin``)."""

    def __init__(self, rpc: Rpc) -> None:
        self._rpc = rpc

    def bump_epoch(self, *, expected_epoch: int = 0) -> int:
        """Raise the scheduler epoch: every live claim of the old epoch is fenced. With
        ``expected_epoch`` (non-zero) only if the epoch is still that one. The new epoch."""
        request = admin_pb2.BumpEpochRequest(expected_epoch=expected_epoch)
        return self._rpc.call(self._rpc.admin.BumpEpoch, request).epoch

    def approve_retry(
        self, task_id: str, *, resolution: EffectState, reason: str = ""
    ) -> tuple[TaskInfo, list[EffectInfo]]:
        """Let a NEEDS_APPROVAL task run again, deciding what became of its uncertain effects:
        ABSENT (send again, same key) or COMMITTED (skip them)."""
        request = admin_pb2.ApproveRetryRequest(
            task_id=task_id,
            resolution=types_pb2.EffectState.ValueType(int(resolution)),
            reason=reason,
        )
        response = self._rpc.call(self._rpc.admin.ApproveRetry, request)
        return TaskInfo.from_proto(response.task), [
            EffectInfo.from_proto(e) for e in response.effects
        ]
