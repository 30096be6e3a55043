"""AdminService: the safe-rollback controls (epoch, pause, drain) over ``store.admin``.

Roles arrive with authentication; until then any caller may use these, and every mutation is
logged with the caller's principal so a rollback can be traced.
"""

from __future__ import annotations

import grpc
import structlog

from coordinator.domain.validation import non_negative
from coordinator.server import convert, validate
from coordinator.server.identity import principal_of
from coordinator.server.status import rpc
from coordinator.store import Store
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
        """The current scheduler epoch and whether claims are paused."""
        admin = self._store.admin
        return admin_pb2.GetEpochResponse(epoch=admin.epoch(), claims_paused=admin.claims_paused())

    @rpc
    def BumpEpoch(  # noqa: N802
        self, request: admin_pb2.BumpEpochRequest, context: grpc.ServicerContext
    ) -> admin_pb2.BumpEpochResponse:
        """Raise the epoch by one (optionally only from ``expected_epoch``)."""
        expected = non_negative("expected_epoch", request.expected_epoch)
        principal = principal_of(context)
        epoch = self._store.admin.bump_epoch(expected)
        log.warning("scheduler epoch bumped", epoch=epoch, principal=principal)
        return admin_pb2.BumpEpochResponse(epoch=epoch)

    @rpc
    def PauseClaims(  # noqa: N802
        self, request: admin_pb2.PauseClaimsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.PauseClaimsResponse:
        """Refuse new claims until ResumeClaims."""
        reason = validate.text("reason", request.reason)
        principal = principal_of(context)
        self._store.admin.pause_claims(reason)
        log.warning("claims paused", reason=reason, principal=principal)
        return admin_pb2.PauseClaimsResponse(claims_paused=self._store.admin.claims_paused())

    @rpc
    def ResumeClaims(  # noqa: N802
        self, request: admin_pb2.ResumeClaimsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ResumeClaimsResponse:
        """Accept new claims again."""
        principal = principal_of(context)
        self._store.admin.resume_claims()
        log.warning("claims resumed", principal=principal)
        return admin_pb2.ResumeClaimsResponse(claims_paused=self._store.admin.claims_paused())

    @rpc
    def DrainStatus(  # noqa: N802
        self, request: admin_pb2.DrainStatusRequest, context: grpc.ServicerContext
    ) -> admin_pb2.DrainStatusResponse:
        """What still runs: live leases and staged-but-uncommitted results."""
        return convert.drain_response(self._store.admin.drain_status())
