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
    FIRST_SCHEMA,
    SCHEMA_VERSION,
    VersionRecord,
    coordinator_refusal,
    is_below,
    parse_version,
)
from coordinator.errors import FailedPrecondition
from coordinator.store.context import StoreContext, epoch_from_kv
from coordinator.store.etcd.ops import KV, create_revision_is, get, mod_revision_is, put

log = structlog.get_logger(__name__)

_CAS_TRIES = 8


@dataclass(frozen=True)
class MinimumsSet:
    """The record after SetMinimumVersions and the epoch its txn bumped to."""

    record: VersionRecord
    epoch: int


class VersionStore:
    """The ``{prefix}/meta/versions`` record."""

    def __init__(self, ctx: StoreContext, own_version: str = coordinator.__version__) -> None:
        self._ctx = ctx
        self._own_version = own_version

    def ensure(self) -> VersionRecord:
        """Create the record (no minimums) if this keyspace has none; return the stored one."""
        key = self._ctx.keys.versions
        self._ctx.kv.txn([create_revision_is(key, 0)], [put(key, VersionRecord().encode())])
        return self.read()

    def read(self) -> VersionRecord:
        """The stored record (a keyspace without one admits everything)."""
        return _decoded(self._ctx.kv.get(self._ctx.keys.versions))

    def set_minimums(
        self,
        *,
        min_coordinator_version: str = "",
        min_sdk_version: str = "",
        require_sdk_version: bool | None = None,
        allow_lower: bool = False,
        schema_version: int = 0,
    ) -> MinimumsSet:
        """Raise the minimums (empty: unchanged) and the schema (0: unchanged) and bump the
        epoch, in one txn; a call that would change nothing writes nothing and answers the
        epoch as it is (a deploy job that sets its minimums on every run must not fence the
        pool each time).

        A minimum below the stored one is refused unless ``allow_lower`` (lowering lets old
        binaries back in, so it must be deliberate). A schema is never lowered (records of the
        newer layout may exist), nor raised past the one this coordinator knows.
        """
        keys, kv = self._ctx.keys, self._ctx.kv
        if min_coordinator_version:
            _refuse_beyond_self(min_coordinator_version, self._own_version)
        if min_sdk_version:
            parse_version("min_sdk_version", min_sdk_version)
        for _ in range(_CAS_TRIES):
            snap = kv.read(get(keys.versions), get(keys.epoch))
            record_kv, epoch_kv = snap.range_one(0), snap.range_one(1)
            current = _decoded(record_kv)
            if not allow_lower:
                _refuse_lowering(
                    "min_coordinator_version",
                    current.min_coordinator_version,
                    min_coordinator_version,
                )
                _refuse_lowering("min_sdk_version", current.min_sdk_version, min_sdk_version)
            _refuse_schema(schema_version, current.schema_version)
            record = replace(
                current,
                min_coordinator_version=min_coordinator_version or current.min_coordinator_version,
                min_sdk_version=min_sdk_version or current.min_sdk_version,
                require_sdk_version=current.require_sdk_version
                if require_sdk_version is None
                else require_sdk_version,
                schema_version=max(schema_version, current.schema_version),
            )
            if record_kv is not None and record == current:
                return MinimumsSet(record=current, epoch=epoch_from_kv(epoch_kv))
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


def _decoded(kv: KV | None) -> VersionRecord:
    """The stored record; a keyspace without one (a coordinator has not started on it yet)
    admits everything and is read as the first schema, so nothing writes a newer layout there
    before a record says it may."""
    if kv is None:
        return VersionRecord(schema_version=FIRST_SCHEMA)
    return VersionRecord.decode(kv.value)


def _refuse_schema(requested: int, current: int) -> None:
    """A schema (0: unchanged) below the keyspace's, or past what this coordinator knows."""
    if requested > SCHEMA_VERSION:
        raise FailedPrecondition(
            f"schema_version: this coordinator knows keyspace schemas up to {SCHEMA_VERSION}, "
            f"not {requested}; raise it through a coordinator that knows it"
        )
    if 0 < requested < current:
        raise FailedPrecondition(
            f"schema_version: the keyspace is at schema {current}; a schema is never lowered "
            "(records of its layout may exist)"
        )


def _refuse_beyond_self(requested: str, own: str) -> None:
    """A minimum coordinator version above the answering coordinator's own: it would refuse
    every replica, itself and the admin call that could undo it included."""
    if parse_version("min_coordinator_version", requested) > parse_version("own", own):
        raise FailedPrecondition(
            f"min_coordinator_version: {requested} is above this coordinator's own version "
            f"{own}: every replica, this one included, would refuse every call, the one to "
            "undo it too; raise it through a coordinator of that version once all run it"
        )


def _refuse_lowering(field: str, current: str, requested: str) -> None:
    if requested and is_below(requested, current):
        raise FailedPrecondition(
            f"{field}: {requested} is below the current minimum {current}; lowering a minimum "
            "lets old binaries back in (pass allow_lower, `--allow-lower` on the CLI, to do it "
            "anyway)"
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

    def peek(self) -> VersionRecord | None:
        """The last record read, however old (None before the first read); never reads."""
        with self._lock:
            return self._record

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


SETTLE_TTLS = 2
"""A raised schema's layout is written once the record has said it for this many cache TTLs
(``Standing.writes_schema``; the test suite sets 0, so its stores write the newest layout at
once)."""

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
        settle: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``settle``: how long the record must have said a schema before this replica writes
        its layout (``writes_schema``); ``SETTLE_TTLS`` times ``ttl`` unless given."""
        self._versions = CachedVersions(read, ttl=ttl, clock=clock)
        self._clock = clock
        self._own_version = own_version
        self._own_schema = own_schema
        self._settle = SETTLE_TTLS * ttl if settle is None else settle
        # The schema of the latest reading, and since when (``clock``) every reading said it.
        self._schema_since: tuple[int, float] = (0, 0.0)
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
        if record.schema_version != self._schema_since[0]:  # a new schema: rare, so locked
            with self._lock:
                if record.schema_version != self._schema_since[0]:
                    self._schema_since = record.schema_version, self._clock()
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

    def writes_schema(self, schema: int) -> bool:
        """Whether this replica may write ``schema``'s layout: every reading of the record for
        ``settle`` seconds said ``schema`` or newer.

        A replica that knows only an older schema re-reads the record within ``ttl`` of an
        admin raising it, and is refused from then on (its calls, its loops, its waiting long
        polls); waiting twice that TTL from this replica's own first reading of the new schema
        lets the last of them stop before the first record it could misread is written.

        Asked on every create, it never waits for etcd: it answers from the last reading (the
        version gate and the background loops keep it fresh, and a schema is never lowered, so
        an old reading only delays the new layout). Before any reading: a read, or no."""
        if self._versions.peek() is None and self.record() is None:
            return False
        with self._lock:
            seen, since = self._schema_since
        return seen >= schema and self._clock() - since >= self._settle

    def _say(self, said: str | None, **fields: str) -> None:
        if said == self._said:  # every call asks; the answer rarely changes, so no lock then
            return
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
