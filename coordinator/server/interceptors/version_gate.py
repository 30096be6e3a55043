"""The version gate on the wire and at start.

* ``refuse_old_coordinator``: ``coordinator serve`` calls it before the store starts; a binary
  below the keyspace's minimum coordinator version, or knowing an older schema, stops there
  (``VersionRefused``; the CLI exits 2 with the message).
* ``VersionGateInterceptor``: every call's SDK version (metadata ``x-coordinator-sdk-version``,
  sent by coordinator.sdk) is checked against the keyspace's minimum; an older SDK is refused
  FAILED_PRECONDITION naming the minimum. A call without the header (a raw gRPC client) is
  admitted unless the record sets ``require_sdk_version``. AdminService is exempt from the SDK
  check, so an operator can always read and correct the record. A running replica that an
  admin raised the minimum past refuses every call but health. The record is read through a
  short cache, not per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import structlog

import coordinator
from coordinator.domain.versions import (
    SCHEMA_VERSION,
    VersionRecord,
    coordinator_refusal,
    sdk_refusal,
)
from coordinator.errors import ConfigError
from coordinator.server.interceptors.auth import OPEN_SERVICES
from coordinator.server.interceptors.handlers import Behavior, Handler, metadata_value, rebuilt
from coordinator.store.control.versions import CachedVersions, VersionStore

log = structlog.get_logger(__name__)

SDK_VERSION_METADATA_KEY = "x-coordinator-sdk-version"
"""The gRPC metadata key in which the SDK names its version."""

_ADMIN_SERVICE = "/coordinator.v1.AdminService/"


class VersionRefused(ConfigError):
    """This binary is too old (or knows too old a schema) for the keyspace."""


def refuse_old_coordinator(
    versions: VersionStore,
    own_version: str = coordinator.__version__,
    own_schema: int = SCHEMA_VERSION,
) -> None:
    """Raise VersionRefused if this coordinator must not serve the keyspace."""
    reason = coordinator_refusal(versions.read(), own_version, own_schema)
    if reason is not None:
        raise VersionRefused(f"refusing to start: {reason}")


class VersionGateInterceptor:
    """Refuses calls from SDKs below the minimum, and all calls if this replica is outdated."""

    def __init__(
        self,
        read: Callable[[], VersionRecord],
        *,
        cache_ttl: float = 2.0,
        own_version: str = coordinator.__version__,
        own_schema: int = SCHEMA_VERSION,
    ) -> None:
        self._versions = CachedVersions(read, ttl=cache_ttl)
        self._own_version = own_version
        self._own_schema = own_schema

    def build(self, method: str, handler: Handler) -> Handler:
        """The method's handler, refusing a call FAILED_PRECONDITION when the version record
        says so (read per call, from a cache); open services pass through."""
        if method.startswith(OPEN_SERVICES):
            return handler
        sdk_checked = not method.startswith(_ADMIN_SERVICE)

        def gated(behavior: Behavior) -> Behavior:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                reason = self._refusal(context, sdk_checked=sdk_checked)
                if reason is not None:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)
                return behavior(request, context)

            return run

        return rebuilt(handler, lambda kind, behavior: gated(behavior))

    def _refusal(self, context: grpc.ServicerContext, *, sdk_checked: bool) -> str | None:
        try:
            record = self._versions.get()
        except Exception as exc:  # etcd down and nothing cached: the call fails on its own
            log.warning("version gate: cannot read the version record", error=str(exc))
            return None
        reason = coordinator_refusal(record, self._own_version, self._own_schema)
        if reason is None and sdk_checked:
            metadata = context.invocation_metadata()
            reason = sdk_refusal(record, metadata_value(metadata, SDK_VERSION_METADATA_KEY))
        return reason
