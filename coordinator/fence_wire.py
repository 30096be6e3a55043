"""The fence on the wire, both ways: one conversion shared by the SDK and the server.

The fence is the domain's value (coordinator.domain.decisions.Fence) on both sides of the wire;
a worker sends back exactly what its claim carried, so both sides convert it the same way here.
"""

from __future__ import annotations

from coordinator.domain.decisions import Fence
from coordinator.v1 import types_pb2


def fence_to_proto(fence: Fence) -> types_pb2.Fence:
    """The wire message of ``fence``."""
    return types_pb2.Fence(
        task_id=fence.task_id,
        attempt_id=fence.attempt_id,
        claim_generation=fence.claim_generation,
        scheduler_epoch=fence.scheduler_epoch,
        cancel_generation=fence.cancel_generation,
    )


def fence_from_proto(msg: types_pb2.Fence) -> Fence:
    """The credential of one claim, from the wire, unchecked (the SDK reads what the server
    granted; the server checks a worker's fence in its request parsing)."""
    return Fence(
        task_id=msg.task_id,
        attempt_id=msg.attempt_id,
        claim_generation=msg.claim_generation,
        scheduler_epoch=msg.scheduler_epoch,
        cancel_generation=msg.cancel_generation,
    )
