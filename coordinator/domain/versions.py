"""The version gate's rules (pure): the keyspace's version record and who it admits.

The record lives at ``{prefix}/meta/versions``. A coordinator refuses to start against a
keyspace whose schema is newer than it knows or whose minimum coordinator version it is below;
a running replica below the minimum refuses calls; an SDK below the minimum is refused
FAILED_PRECONDITION. Versions compare as PEP 440 versions (``packaging.version.Version``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from packaging.version import InvalidVersion, Version

from coordinator.errors import InvalidArgument

SCHEMA_VERSION = 3
"""The newest keyspace schema this code reads and writes; a new keyspace starts at it.

1. claim.v1's layout: a task's input inside its task record.
2. A task's input may live in a key of its own, ``{p}/inputs/{id}``, written by the create and
   by UpdateInput only (``TaskRecord.input_in_key``), so the task's moves (claim, commit,
   release, reclaim) rewrite a record of a few hundred bytes instead of the input with it. This
   code reads both layouts; it writes the second only once the keyspace's record says schema 2
   (``INPUT_KEY_SCHEMA``) and has said so long enough for every replica of schema 1 to have
   stopped (``store/control/versions.py::Standing``).
3. A task's current attempt may live in its task record alone (``TaskRecord.attempt_in_record``):
   a claim writes no attempt key, and a commit leaves the committed attempt in the record; the
   attempt gets its key when anything else moves the task (store/transition.py). Two keys fewer
   a claim -> commit cycle. Written once the record says schema 3 (``ATTEMPT_IN_RECORD_SCHEMA``),
   read in both layouts.
"""

FIRST_SCHEMA = 1
"""The schema of a keyspace whose version record does not name one (written before it did)."""

INPUT_KEY_SCHEMA = 2
"""The first schema in which a task's input may live in its own key."""

ATTEMPT_IN_RECORD_SCHEMA = 3
"""The first schema in which a task's current attempt may live in its task record alone."""

NO_MINIMUM = "0"
"""The minimum of a new keyspace: every version is admitted until an admin raises it."""


@dataclass(frozen=True)
class VersionRecord:
    """The keyspace's schema version and the oldest coordinator and SDK it admits.

    ``require_sdk_version``: refuse calls that name no SDK version at all (raw gRPC clients).
    Off by default, so grpcurl and hand-written clients keep working.
    """

    schema_version: int = SCHEMA_VERSION
    min_coordinator_version: str = NO_MINIMUM
    min_sdk_version: str = NO_MINIMUM
    require_sdk_version: bool = False

    def encode(self) -> bytes:
        """The stored JSON."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> VersionRecord:
        """Parse the stored JSON; unknown fields (a newer schema's) are ignored."""
        data = json.loads(raw)
        return cls(
            schema_version=int(data.get("schema_version", FIRST_SCHEMA)),
            min_coordinator_version=str(data.get("min_coordinator_version", NO_MINIMUM)),
            min_sdk_version=str(data.get("min_sdk_version", NO_MINIMUM)),
            require_sdk_version=bool(data.get("require_sdk_version", False)),
        )


MAX_VERSION_LENGTH = 64
"""The longest version string read (a longer one is no version: ``packaging`` would spend its
time on, or refuse with a ValueError, a release number of thousands of digits)."""


def parse_version(field: str, value: str) -> Version:
    """``value`` as a version; InvalidArgument naming ``field`` if it is not one."""
    if len(value) > MAX_VERSION_LENGTH:
        raise InvalidArgument(
            f"{field}: {len(value)} characters is not a version (at most {MAX_VERSION_LENGTH})"
        )
    try:
        return Version(value)
    except (InvalidVersion, ValueError) as exc:
        raise InvalidArgument(f"{field}: {value!r} is not a version (e.g. 1.2.0)") from exc


def is_below(version: str, minimum: str) -> bool:
    """Whether ``version`` is older than ``minimum`` (an unparseable version counts as older)."""
    try:
        return parse_version("version", version) < parse_version("minimum", minimum)
    except InvalidArgument:
        return True


def coordinator_refusal(
    record: VersionRecord, own_version: str, own_schema: int = SCHEMA_VERSION
) -> str | None:
    """Why a coordinator of ``own_version`` (knowing ``own_schema``) must not serve this
    keyspace, or None if it may."""
    if own_schema < record.schema_version:
        return (
            f"this coordinator knows keyspace schema {own_schema}, but the keyspace is at "
            f"schema {record.schema_version}; upgrade the coordinator"
        )
    if is_below(own_version, record.min_coordinator_version):
        return (
            f"coordinator version {own_version} is below the keyspace's minimum coordinator "
            f"version {record.min_coordinator_version}; upgrade the coordinator"
        )
    return None


def sdk_refusal(record: VersionRecord, sdk_version: str | None) -> str | None:
    """Why a call from an SDK of ``sdk_version`` (None: the call named none) is refused, or
    None if it is admitted."""
    if sdk_version is None:
        if record.require_sdk_version:
            return (
                "this keyspace requires clients to send their SDK version "
                f"(x-coordinator-sdk-version); minimum SDK version is {record.min_sdk_version}"
            )
        return None
    if is_below(sdk_version, record.min_sdk_version):
        return (
            f"SDK version {sdk_version} is below the minimum SDK version "
            f"{record.min_sdk_version}; upgrade the coordinator SDK"
        )
    return None
