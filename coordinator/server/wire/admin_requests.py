"""AdminService's requests, each parsed in one place: ``parse_<rpc>`` checks every field of one
RPC's request and returns a typed value or raises InvalidArgument naming the first field that
is wrong; the handler calls it first, so a bad request writes nothing. GetEpoch, GetStats and
GetVersions have no field to parse.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.domain.effects import EffectState
from coordinator.domain.validation import non_negative, task_id
from coordinator.server.wire import common_wire, effect_wire, task_wire
from coordinator.v1 import admin_pb2


@dataclass(frozen=True)
class BumpArgs:
    """A BumpEpoch: from ``expected_epoch`` only (0: whatever it is), revoking leases or not."""

    expected_epoch: int
    revoke_leases: bool


def parse_bump_epoch(request: admin_pb2.BumpEpochRequest) -> BumpArgs:
    """BumpEpoch's request."""
    return BumpArgs(
        expected_epoch=non_negative("expected_epoch", request.expected_epoch),
        revoke_leases=request.revoke_leases,
    )


def parse_pause_claims(request: admin_pb2.PauseClaimsRequest) -> tuple[str, str]:
    """PauseClaims' request: the reason and the queue ("" for every queue)."""
    reason = common_wire.parse_text("reason", request.reason)
    return reason, task_wire.parse_queue_filter(request.queue)


def parse_resume_claims(request: admin_pb2.ResumeClaimsRequest) -> str:
    """ResumeClaims' request: the queue ("" for every queue)."""
    return task_wire.parse_queue_filter(request.queue)


def parse_drain_status(request: admin_pb2.DrainStatusRequest) -> str:
    """DrainStatus' request: the queue ("" for every queue)."""
    return task_wire.parse_queue_filter(request.queue)


@dataclass(frozen=True)
class ApproveArgs:
    """An ApproveRetry: how the task's uncertain effects are resolved, and why."""

    task_id: str
    resolution: EffectState
    reason: str


def parse_approve_retry(request: admin_pb2.ApproveRetryRequest) -> ApproveArgs:
    """ApproveRetry's request."""
    return ApproveArgs(
        task_id=task_id(request.task_id),
        resolution=effect_wire.parse_resolution(request.resolution),
        reason=common_wire.parse_text("reason", request.reason),
    )


@dataclass(frozen=True)
class MinimumsArgs:
    """A SetMinimumVersions: empty versions leave a minimum unchanged, None the SDK rule."""

    min_coordinator_version: str
    min_sdk_version: str
    require_sdk_version: bool | None
    allow_lower: bool
    schema_version: int


def parse_set_minimum_versions(request: admin_pb2.SetMinimumVersionsRequest) -> MinimumsArgs:
    """SetMinimumVersions' request; the versions' syntax is the version store's to judge (it
    compares them with the stored ones in the same txn)."""
    return MinimumsArgs(
        min_coordinator_version=request.min_coordinator_version.strip(),
        min_sdk_version=request.min_sdk_version.strip(),
        require_sdk_version=(
            request.require_sdk_version if request.HasField("require_sdk_version") else None
        ),
        allow_lower=request.allow_lower,
        schema_version=non_negative("schema_version", request.schema_version),
    )
