"""The space guard's rule: which writes may reach etcd as its database fills.

etcd stops every write at its quota (the ``NOSPACE`` alarm) and only an operator's compaction,
defragmentation and disarm bring it back; worse, it prices a txn by its top-level puts only
(``costTxnReq``), so a put nested in a txn's ``RequestTxn`` passes even an active alarm. The
coordinator therefore decides for itself, from etcd's db size and alarms, before anything is
sent:

* below the high-water mark every write goes through;
* above it, writes that only grow the keyspace (creates, input changes, checkpoints, staged
  results, new idempotency keys) are refused, while the writes that move work towards its end
  (claims, renewals, commits, releases, fails, the pruner's deletes) go on, so the pool drains
  instead of stopping; a write made within its caller's high-water share (a small part of the
  caller's write budget, decided at the door: coordinator/server/interceptors/high_water.py)
  still goes, so the principals that filled etcd are refused and a pool creating small tasks is
  not;
* above it, a task that has had RETRIES_ABOVE_HIGH_WATER attempts is not claimed again: each
  retry writes an attempt and its events whatever its calls carry, so a worker failing or
  releasing its claims as fast as it can (a retry policy without a bound or a backoff) grew
  etcd past the mark with nothing else refused (``retry_refusal``);
* above the full mark (between the high-water mark and the quota) no growth goes at all, shares
  included: the room left is for the pool to drain;
* at an active NOSPACE alarm no txn that puts a key goes to etcd, nested or not; txns that only
  read, compare or delete still do (etcd itself lets those through, and they are what frees
  space once etcd is compacted), except on the etcd versions that refuse every txn at NOSPACE
  (``refuses_every_txn_at_nospace``), where what only reads and compares is read by Ranges
  (store/etcd/nospace_reads.py) and deletes wait for the alarm's end.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from packaging.version import InvalidVersion, Version


class SpaceState(enum.Enum):
    """How full etcd is, as the guard last saw it."""

    CLEAR = "clear"
    HIGH_WATER = "high_water"
    FULL = "full"
    NOSPACE = "nospace"


class WriteKind(enum.Enum):
    """What a txn does to the keyspace's size."""

    DRAIN = "drain"
    """Moves work towards its end, or reads (claims, renewals, commits, releases, prunes)."""
    GROWTH = "growth"
    """Only adds data (creates, input changes, checkpoints, staging, idempotency keys)."""


class SpaceVerdict(enum.Enum):
    """The guard's answer for one txn."""

    ALLOW = "allow"
    REFUSE_HIGH_WATER = "refuse_high_water"
    REFUSE_FULL = "refuse_full"
    REFUSE_NOSPACE = "refuse_nospace"


def space_state(
    *, db_size: int, quota_bytes: int, high_water: float, full: float = 1.0, nospace_alarm: bool
) -> SpaceState:
    """The state from one reading: an active alarm wins over any size (it stays raised after a
    defragmentation until an operator disarms it), then the share of the quota (``full`` at or
    below ``high_water`` leaves no room for shares)."""
    if nospace_alarm:
        return SpaceState.NOSPACE
    if db_size >= full * quota_bytes:
        return SpaceState.FULL
    if db_size >= high_water * quota_bytes:
        return SpaceState.HIGH_WATER
    return SpaceState.CLEAR


def decide_write(
    kind: WriteKind, state: SpaceState, *, puts: bool, within_share: bool = False
) -> SpaceVerdict:
    """Whether a txn of ``kind`` (``puts``: whether it, or any txn nested in it, puts a key)
    may go to etcd in ``state``; ``within_share``: its caller's high-water share admitted it."""
    if state is SpaceState.NOSPACE and (puts or kind is WriteKind.GROWTH):
        return SpaceVerdict.REFUSE_NOSPACE
    if kind is not WriteKind.GROWTH:
        return SpaceVerdict.ALLOW
    if state is SpaceState.FULL:
        return SpaceVerdict.REFUSE_FULL
    if state is SpaceState.HIGH_WATER and not within_share:
        return SpaceVerdict.REFUSE_HIGH_WATER
    return SpaceVerdict.ALLOW


def refusal_message(verdict: SpaceVerdict, *, retry_after: float) -> str:
    """The typed refusal's message: which guard refused, why, and when to try again."""
    if verdict is SpaceVerdict.REFUSE_NOSPACE:
        return (
            "space guard: etcd's NOSPACE alarm is active, so no write goes to etcd; an operator "
            "must compact, defragment and disarm etcd (docs/retention.md); "
            f"retry after {retry_after:g} s"
        )
    if verdict is SpaceVerdict.REFUSE_FULL:
        return (
            "space guard: etcd's database is above its full mark, so no write that only adds "
            "data (creates, input changes, checkpoints, staged results, idempotency keys) goes "
            "while claims, commits and releases drain the pool; "
            f"retry after {retry_after:g} s"
        )
    return (
        "space guard: etcd's database is above its high-water mark and this write does not "
        "fit its caller's high-water share of their write budget (callers without a budget "
        "have none), so writes that only add data (creates, input changes, checkpoints, "
        "staged results, idempotency keys) are refused while claims, commits and releases "
        "drain the pool; "
        f"retry after {retry_after:g} s"
    )


RETRIES_ABOVE_HIGH_WATER = 8
"""Attempts a task may have had and still be claimed while etcd is above its high-water mark:
its first attempt and a few retries run (the pool drains); past them it waits for the guard to
clear, READY and untouched (no attempt is counted or written)."""


def retry_refusal(state: SpaceState, attempts: int, *, retry_after: float) -> str:
    """Why a claim that would start attempt ``attempts + 1`` of a task may not go in ``state``
    ("" when it may)."""
    if state is SpaceState.CLEAR or attempts < RETRIES_ABOVE_HIGH_WATER:
        return ""
    return (
        f"space guard: etcd's database is above its high-water mark and this task has had "
        f"{attempts} attempts; each retry writes an attempt and its events, so a task past "
        f"{RETRIES_ABOVE_HIGH_WATER} attempts is not claimed until the guard clears (the pool "
        f"drains meanwhile); retry after {retry_after:g} s"
    )


def compaction_target(
    samples: Sequence[tuple[float, int]], *, now: float, keep: float, compacted: int
) -> int | None:
    """The revision to compact etcd's history to, from ``(time, revision)`` readings (oldest
    first): the newest one at least ``keep`` seconds old, if it is past ``compacted`` (what
    was compacted already); None for nothing to do."""
    old = [revision for at, revision in samples if now - at >= keep]
    if not old or old[-1] <= compacted:
        return None
    return old[-1]


def refuses_every_txn_at_nospace(etcd_version: str) -> bool:
    """Whether an etcd of this version refuses every txn while its NOSPACE alarm is up, even one
    that only reads, compares or deletes: 3.5.0 to 3.5.6 (etcd issue 13429, fixed in 3.5.7).
    False for a version that cannot be parsed."""
    try:
        version = Version(etcd_version)
    except InvalidVersion:
        return False
    return Version("3.5.0") <= version < Version("3.5.7")
