"""AdminService's answers on the wire: drain status, the stats and the version record. Pure and
mechanical (see common_wire)."""

from __future__ import annotations

from coordinator.domain.queue_stats import QueueReport
from coordinator.domain.versions import VersionRecord
from coordinator.metrics import PointCoverage
from coordinator.store.types import DrainStatus
from coordinator.v1 import admin_pb2


def drain_to_proto(status: DrainStatus) -> admin_pb2.DrainStatusResponse:
    """DrainStatusResponse, including the derived ``drained`` flag."""
    return admin_pb2.DrainStatusResponse(
        epoch=status.epoch,
        claims_paused=status.claims_paused,
        active_leases=status.active_leases,
        unknown_effects=status.unknown_effects,
        staged_uncommitted=status.staged_uncommitted,
        drained=status.drained,
        queue=status.queue,
        queue_paused=status.queue_paused,
    )


def stats_to_proto(points: list[PointCoverage], queues: QueueReport) -> admin_pb2.GetStatsResponse:
    """GetStatsResponse: fence-check coverage per acceptance point, and the queue figures."""
    return admin_pb2.GetStatsResponse(
        queues=[
            admin_pb2.QueueStats(
                queue=q.queue,
                ready_tasks=q.ready,
                oldest_ready_age_seconds=q.oldest_ready_age,
                claimed_tasks=q.claimed,
                blocked_tasks=q.blocked,
                overdue_tasks=q.overdue,
            )
            for q in queues.queues
        ],
        queues_left_out=queues.left_out,
        fence_coverage=[
            admin_pb2.FenceCoverage(
                point=admin_pb2.AcceptancePoint.ValueType(int(p.point)),
                accepted=p.accepted,
                validated=p.validated,
                coverage=p.coverage,
            )
            for p in points
        ],
    )


def versions_to_proto(record: VersionRecord) -> admin_pb2.VersionRecord:
    """The wire form of the version gate's record."""
    return admin_pb2.VersionRecord(
        schema_version=record.schema_version,
        min_coordinator_version=record.min_coordinator_version,
        min_sdk_version=record.min_sdk_version,
        require_sdk_version=record.require_sdk_version,
    )
