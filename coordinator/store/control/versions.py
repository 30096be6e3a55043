"""The version gate's record in etcd: create it if absent, read it, raise the minimums.

Raising a minimum writes the record and bumps the scheduler epoch in ONE txn: every claim made
before carries the old epoch, so an old worker's renew and commit are refused from that
revision on and no old binary holds authority across the change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import structlog

import coordinator
from coordinator.domain.versions import (
    SCHEMA_VERSION,
    VersionRecord,
    coordinator_refusal,
    is_below,
    parse_version,
)
from coordinator.errors import FailedPrecondition
from coordinator.store.context import StoreContext, epoch_from_kv
from coordinator.store.etcd.ops import create_revision_is, get, mod_revision_is, put

log = structlog.get_logger(__name__)

_CAS_TRIES = 8


@dataclass(frozen=True)
class MinimumsSet:
    """The record after SetMinimumVersions and the epoch its txn bumped to."""

    record: VersionRecord
    epoch: int


class VersionStore:
    """The ``{prefix}/meta/versions`` record."""

    def __init__(self, ctx: StoreContext) -> None:
        self._ctx = ctx

    def ensure(self) -> VersionRecord:
        """Create the record (no minimums) if this keyspace has none; return the stored one."""
        key = self._ctx.keys.versions
        self._ctx.kv.txn([create_revision_is(key, 0)], [put(key, VersionRecord().encode())])
        return self.read()

    def read(self) -> VersionRecord:
        """The stored record (a keyspace without one admits everything)."""
        kv = self._ctx.kv.get(self._ctx.keys.versions)
        return VersionRecord() if kv is None else VersionRecord.decode(kv.value)

    def set_minimums(
        self,
        *,
        min_coordinator_version: str = "",
        min_sdk_version: str = "",
        require_sdk_version: bool | None = None,
        allow_lower: bool = False,
    ) -> MinimumsSet:
        """Raise the minimums (empty: unchanged) and bump the epoch, in one txn.

        A minimum below the stored one is refused unless ``allow_lower`` (lowering lets old
        binaries back in, so it must be deliberate).
        """
        keys, kv = self._ctx.keys, self._ctx.kv
        if min_coordinator_version:
            parse_version("min_coordinator_version", min_coordinator_version)
        if min_sdk_version:
            parse_version("min_sdk_version", min_sdk_version)
        for _ in range(_CAS_TRIES):
            snap = kv.read(get(keys.versions), get(keys.epoch))
            record_kv, epoch_kv = snap.range_one(0), snap.range_one(1)
            current = (
                VersionRecord() if record_kv is None else VersionRecord.decode(record_kv.value)
            )
            if not allow_lower:
                _refuse_lowering(
                    "min_coordinator_version",
                    current.min_coordinator_version,
                    min_coordinator_version,
                )
                _refuse_lowering("min_sdk_version", current.min_sdk_version, min_sdk_version)
            record = replace(
                current,
                min_coordinator_version=min_coordinator_version or current.min_coordinator_version,
                min_sdk_version=min_sdk_version or current.min_sdk_version,
                require_sdk_version=current.require_sdk_version
                if require_sdk_version is None
                else require_sdk_version,
            )
            epoch = epoch_from_kv(epoch_kv) + 1
            result = kv.txn(
                [
                    mod_revision_is(keys.versions, record_kv.mod_revision if record_kv else 0),
                    mod_revision_is(keys.epoch, epoch_kv.mod_revision if epoch_kv else 0),
                ],
                [put(keys.versions, record.encode()), put(keys.epoch, str(epoch).encode())],
            )
            if result.succeeded:
                return MinimumsSet(record=record, epoch=epoch)
        raise FailedPrecondition("the version record or the epoch kept changing; try again")


def _refuse_lowering(field: str, current: str, requested: str) -> None:
    if requested and is_below(requested, current):
        raise FailedPrecondition(
            f"{field}: {requested} is below the current minimum {current}; lowering a minimum "
            "lets old binaries back in (pass allow_lower to do it anyway)"
        )


class CachedVersions:
    """The record, re-read at most every ``ttl`` seconds (the gate reads it on every call).

    If etcd cannot be read, the last known record is kept (the gate must not turn an etcd
    blip into refused calls; the store calls themselves will fail on their own).
    """

    def __init__(
        self,
        read: Callable[[], VersionRecord],
        *,
        ttl: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._record: VersionRecord | None = None
        self._read_at = 0.0

    def get(self) -> VersionRecord:
        """The record, at most ``ttl`` seconds old (when etcd answers)."""
        now = self._clock()
        with self._lock:
            if self._record is not None and now - self._read_at < self._ttl:
                return self._record
        try:
            record = self._read()
        except Exception:
            with self._lock:
                if self._record is not None:
                    return self._record
            raise
        with self._lock:
            self._record, self._read_at = record, now
        return record


_UNREAD = "the version record cannot be read"
"""What ``Standing`` last said when that was not a refusal but a failed read."""


class Standing:
    """Whether the version record admits this replica now, read through one cache for the
    whole replica: the version gate asks it on every call, and the background loops (the
    reclaimer, the releaser, the promoter and deadline pass, the reconcile sweeper, the pruner)
    before each unit of work.

    A replica an admin raised the minimum coordinator version past, or that knows an older
    schema than the keyspace's, has its calls refused (the version gate); from the same cache
    reading on, its loops write nothing either, so no old binary acts on the keyspace after the
    change, not even in the background. Admitted again (a minimum lowered with allow_lower), the
    loops go on; their next scan finds what they skipped. A record that cannot be read counts
    as admitted: the work would meet the same etcd and fail on its own.
    """

    def __init__(
        self,
        read: Callable[[], VersionRecord],
        *,
        own_version: str = coordinator.__version__,
        own_schema: int = SCHEMA_VERSION,
        ttl: float = 2.0,
    ) -> None:
        self._versions = CachedVersions(read, ttl=ttl)
        self._own_version = own_version
        self._own_schema = own_schema
        self._lock = threading.Lock()
        # What the log last said: a refusal's text, _UNREAD, or None (admitted).
        self._said: str | None = None
        # The last reading and its verdict.
        self._judged: tuple[VersionRecord | None, str | None] = (None, None)

    def record(self) -> VersionRecord | None:
        """The record, at most ``ttl`` seconds old; None if it was never read and cannot be."""
        try:
            record = self._versions.get()
        except Exception as exc:
            self._say(_UNREAD, error=str(exc))
            return None
        return record

    def current(self) -> tuple[VersionRecord | None, str | None]:
        """The record (None if unreadable) and why it refuses this replica (None: admitted);
        says so in the log when the answer changes."""
        record = self.record()
        if record is None:
            return None, None
        judged, refusal = self._judged
        if judged is not record:  # judged once per reading, not on every call
            refusal = coordinator_refusal(record, self._own_version, self._own_schema)
            self._judged = record, refusal
        self._say(refusal)
        return record, refusal

    def refusal(self) -> str | None:
        """Why the record (at most ``ttl`` seconds old) refuses this replica, None if it
        admits it."""
        return self.current()[1]

    def _say(self, said: str | None, **fields: str) -> None:
        with self._lock:
            changed, self._said = said != self._said, said
        if not changed:
            return
        if said is None:
            log.info("admitted by the version record: calls and background work go on")
        elif said is _UNREAD:
            log.warning("cannot read the version record: admitted until it can be", **fields)
        else:
            log.warning(
                "refused by the version record: calls refused, background work paused", reason=said
            )
