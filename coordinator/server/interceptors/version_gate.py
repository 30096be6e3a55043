"""The version gate on the wire and at start.

* ``refuse_old_coordinator``: ``coordinator serve`` calls it before the store starts; a binary
  below the keyspace's minimum coordinator version, or knowing an older schema, stops there
  (``VersionRefused``; the CLI exits 2 with the message).
* ``VersionGateInterceptor``: every call's SDK version (metadata ``x-coordinator-sdk-version``,
  sent by coordinator.sdk) is checked against the keyspace's minimum; an older SDK is refused
  FAILED_PRECONDITION naming the minimum. A call without the header (a raw gRPC client) is
  admitted unless the record sets ``require_sdk_version``. AdminService is exempt from the SDK
  check, so an operator can always read and correct the record. A running replica that an
  admin raised the minimum past refuses every call but health UNAVAILABLE (another replica may
  serve it: the SDK moves on to the next one, a pool keeps polling instead of stopping) and
  answers its readiness NOT_SERVING. It still answers GetVersions and GetEpoch, and a
  SetMinimumVersions that lowers the minimum coordinator version (``allow_lower``) when the
  keyspace's schema is one it knows: after a binary rollback the operator undoes the raise
  through the old replicas, instead of editing etcd by hand. The record is read through the
  replica's ``Standing`` (store/control/versions.py), the cache its background loops ask too,
  so calls and loops are refused from the same reading on.
"""

from __future__ import annotations

from typing import Any

import grpc

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
from coordinator.store.control.versions import Standing, VersionStore

SDK_VERSION_METADATA_KEY = "x-coordinator-sdk-version"
"""The gRPC metadata key in which the SDK names its version."""

_ADMIN_SERVICE = "/coordinator.v1.AdminService/"
_ANSWERED_WHEN_REFUSED = frozenset({f"{_ADMIN_SERVICE}GetVersions", f"{_ADMIN_SERVICE}GetEpoch"})
_SET_MINIMUMS = f"{_ADMIN_SERVICE}SetMinimumVersions"


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

    def __init__(self, standing: Standing) -> None:
        self._standing = standing

    def build(self, method: str, handler: Handler) -> Handler:
        """The method's handler, refusing a call when the version record says so (read per
        call, from a cache): UNAVAILABLE when it refuses this replica, FAILED_PRECONDITION when
        it refuses the caller's SDK; open services and the reads an operator needs pass."""
        if method.startswith(OPEN_SERVICES) or method in _ANSWERED_WHEN_REFUSED:
            return handler
        sdk_checked = not method.startswith(_ADMIN_SERVICE)

        def gated(behavior: Behavior) -> Behavior:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                record, refusal = self._standing.current()  # None: unreadable, fails on its own
                if record is not None:
                    if refusal is not None and not _undoes_a_raise(method, request, record):
                        context.abort(grpc.StatusCode.UNAVAILABLE, f"{refusal}{_ELSEWHERE}")
                    reason = _sdk_refusal(record, context) if sdk_checked else None
                    if reason is not None:
                        context.abort(grpc.StatusCode.FAILED_PRECONDITION, reason)
                return behavior(request, context)

            return run

        return rebuilt(handler, lambda kind, behavior: gated(behavior))


_ELSEWHERE = " (this replica serves nothing until then; another replica may serve the call)"


def _sdk_refusal(record: VersionRecord, context: grpc.ServicerContext) -> str | None:
    metadata = context.invocation_metadata()
    return sdk_refusal(record, metadata_value(metadata, SDK_VERSION_METADATA_KEY))


def _undoes_a_raise(method: str, request: Any, record: VersionRecord) -> bool:
    """Whether the call is a SetMinimumVersions lowering the minimum coordinator version on a
    keyspace whose schema this binary knows: the one write a refused replica takes (the store
    still refuses a minimum above this binary's own version)."""
    return (
        method == _SET_MINIMUMS
        and bool(request.allow_lower and request.min_coordinator_version)
        and record.schema_version <= SCHEMA_VERSION
    )
