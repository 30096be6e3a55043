"""AdminService: the safe-rollback controls (epoch, pause, drain) over ``store.admin``.

Who may call which method is the auth interceptor's table
(coordinator.server.interceptors.auth); every mutation is logged with the caller's principal so
a rollback can be traced.
"""

from __future__ import annotations

from dataclasses import replace

import grpc
import structlog

import coordinator
from coordinator.server.identity import principal_of
from coordinator.server.status import rpc
from coordinator.server.wire import admin_requests as requests
from coordinator.server.wire import admin_wire, effect_wire, task_wire
from coordinator.store import Store
from coordinator.store.control.versions import VersionStore
from coordinator.v1 import admin_pb2, admin_pb2_grpc

log = structlog.get_logger(__name__)


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    """Admin calls onto ``store.admin`` (method names are the proto's: noqa N802)."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @rpc
    def GetEpoch(  # noqa: N802
        self, request: admin_pb2.GetEpochRequest, context: grpc.ServicerContext
    ) -> admin_pb2.GetEpochResponse:
        """The current scheduler epoch, whether claims are paused, and the paused queues."""
        admin = self._store.admin
        return admin_pb2.GetEpochResponse(
            epoch=admin.epoch(),
            claims_paused=admin.claims_paused(),
            paused_queues=admin.paused_queues(),
        )

    @rpc
    def BumpEpoch(  # noqa: N802
        self, request: admin_pb2.BumpEpochRequest, context: grpc.ServicerContext
    ) -> admin_pb2.BumpEpochResponse:
        """Raise the epoch by one (optionally only from ``expected_epoch``); with
        ``revoke_leases``, also end every claim made before the bump."""
        args = requests.parse_bump_epoch(request)
        principal = principal_of(context)
        revoked = 0
        if args.revoke_leases:
            epoch, revoked = self._store.admin.bump_epoch_revoking(args.expected_epoch)
        else:
            epoch = self._store.admin.bump_epoch(args.expected_epoch)
        log.warning("scheduler epoch bumped", epoch=epoch, principal=principal, revoked=revoked)
        return admin_pb2.BumpEpochResponse(epoch=epoch, revoked_leases=revoked)

    @rpc
    def PauseClaims(  # noqa: N802
        self, request: admin_pb2.PauseClaimsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.PauseClaimsResponse:
        """Refuse new claims (of one queue's tasks, with ``queue``) until ResumeClaims."""
        reason, queue = requests.parse_pause_claims(request)
        principal = principal_of(context)
        self._store.admin.pause_claims(reason, queue)
        log.warning("claims paused", reason=reason, queue=queue or "*", principal=principal)
        admin = self._store.admin
        return admin_pb2.PauseClaimsResponse(
            claims_paused=admin.claims_paused(), paused_queues=admin.paused_queues()
        )

    @rpc
    def ResumeClaims(  # noqa: N802
        self, request: admin_pb2.ResumeClaimsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ResumeClaimsResponse:
        """Accept new claims again (of one queue's tasks, with ``queue``)."""
        queue = requests.parse_resume_claims(request)
        principal = principal_of(context)
        self._store.admin.resume_claims(queue)
        log.warning("claims resumed", queue=queue or "*", principal=principal)
        admin = self._store.admin
        return admin_pb2.ResumeClaimsResponse(
            claims_paused=admin.claims_paused(), paused_queues=admin.paused_queues()
        )

    @rpc
    def DrainStatus(  # noqa: N802
        self, request: admin_pb2.DrainStatusRequest, context: grpc.ServicerContext
    ) -> admin_pb2.DrainStatusResponse:
        """What still runs (of one queue's tasks, with ``queue``): live leases, uncertain
        effects, staged-but-uncommitted results."""
        queue = requests.parse_drain_status(request)
        status = self._store.admin.drain_status(queue)
        if not queue:
            status = replace(status, unknown_effects=self._store.effects.count_open())
        return admin_wire.drain_to_proto(status)

    @rpc
    def ApproveRetry(  # noqa: N802
        self, request: admin_pb2.ApproveRetryRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ApproveRetryResponse:
        """Resolve a NEEDS_APPROVAL task's uncertain effects and make it claimable again."""
        args = requests.parse_approve_retry(request)
        tid, resolution, reason = args.task_id, args.resolution, args.reason
        principal = principal_of(context)
        task, effects = self._store.effects.approve_retry(
            tid, by=principal, resolution=resolution, reason=reason
        )
        log.warning(
            "retry approved",
            task_id=tid,
            principal=principal,
            resolution=resolution.name,
            effects=[e.effect_id for e in effects],
            reason=reason,
        )
        return admin_pb2.ApproveRetryResponse(
            task=task_wire.task_to_proto(self._store.tasks.with_input(task)),
            effects=[effect_wire.effect_to_proto(e) for e in effects],
        )

    @rpc
    def GetStats(  # noqa: N802
        self, request: admin_pb2.GetStatsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.GetStatsResponse:
        """Fence-check coverage per acceptance point (this replica process, since start) and
        the queue figures (from this replica's watch-fed indexes)."""
        return admin_wire.stats_to_proto(
            self._store.ctx.metrics.fence_coverage(), self._store.queue_report()
        )

    @rpc
    def GetVersions(  # noqa: N802
        self, request: admin_pb2.GetVersionsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.GetVersionsResponse:
        """The version gate's record, and the answering replica's own version."""
        return admin_pb2.GetVersionsResponse(
            versions=admin_wire.versions_to_proto(VersionStore(self._store.ctx).read()),
            coordinator_version=coordinator.__version__,
        )

    @rpc
    def SetMinimumVersions(  # noqa: N802
        self, request: admin_pb2.SetMinimumVersionsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.SetMinimumVersionsResponse:
        """Raise the minimums and bump the epoch in one txn."""
        args = requests.parse_set_minimum_versions(request)
        principal = principal_of(context)
        done = VersionStore(self._store.ctx).set_minimums(
            min_coordinator_version=args.min_coordinator_version,
            min_sdk_version=args.min_sdk_version,
            require_sdk_version=args.require_sdk_version,
            allow_lower=args.allow_lower,
            schema_version=args.schema_version,
        )
        log.warning(
            "minimum versions set; scheduler epoch bumped",
            schema_version=done.record.schema_version,
            principal=principal,
            epoch=done.epoch,
            min_coordinator_version=done.record.min_coordinator_version,
            min_sdk_version=done.record.min_sdk_version,
            require_sdk_version=done.record.require_sdk_version,
        )
        return admin_pb2.SetMinimumVersionsResponse(
            versions=admin_wire.versions_to_proto(done.record), epoch=done.epoch
        )
