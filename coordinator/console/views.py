"""Pure helpers that turn wire values into what a page shows (Jinja filters), and event
positions into the text a link or an SSE id carries."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.errors import InvalidArgument
from coordinator.v1 import tasks_pb2, types_pb2

_PREFIXES = {
    "state": (types_pb2.TaskState, "TASK_STATE_"),
    "end": (types_pb2.AttemptEnd, "ATTEMPT_END_"),
    "effect": (types_pb2.EffectState, "EFFECT_STATE_"),
}
MAX_POSITION_CHARS = 200


def name(value: int, kind: str) -> str:
    """An enum value's name without its prefix (``state``: READY); "-" for UNSPECIFIED."""
    enum, prefix = _PREFIXES[kind]
    if value == 0:
        return "-"
    try:
        return str(enum.Name(value)).removeprefix(prefix)  # type: ignore[arg-type]
    except ValueError:
        return str(value)


def when(ts: Timestamp) -> str:
    """A timestamp as ISO-8601 UTC to the second; "-" when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return "-"
    moment = datetime.fromtimestamp(ts.seconds + ts.nanos / 1e9, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def seconds_of(ts: Timestamp) -> float:
    """A timestamp in seconds since the epoch (0.0 when unset)."""
    return ts.seconds + ts.nanos / 1e9


def duration(seconds: float) -> str:
    """A span for reading, to its two largest units: "45 s", "3 min 12 s", "2 h 5 min",
    "3 d 4 h"; "-" for a negative one."""
    if seconds < 0:
        return "-"
    whole = int(seconds)
    for unit, size, smaller, small_size in _UNITS:
        if whole >= size:
            big, rest = divmod(whole, size)
            tail = f" {rest // small_size} {smaller}" if rest >= small_size else ""
            return f"{big} {unit}{tail}"
    return f"{whole} s"


_UNITS = (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1))


@dataclass(frozen=True)
class ClaimRow:
    """One live claim as the claims page shows it: spans in whole seconds on the
    coordinator's clock (read_at), which the page's script then counts on from."""

    claim: tasks_pb2.LiveClaim
    held: int
    expires_in: int
    renewed_ago: int | None  # None: no renewal reached etcd since the claim
    progress_ago: int


def claim_row(claim: tasks_pb2.LiveClaim, read_at: Timestamp) -> ClaimRow:
    """The spans of ``claim`` as of ``read_at`` (ListClaimsResponse.read_at)."""
    now = seconds_of(read_at)
    return ClaimRow(
        claim=claim,
        held=max(0, int(now - seconds_of(claim.claimed_at))),
        expires_in=int(claim.lease_remaining_seconds),
        renewed_ago=(
            int(claim.lease_granted_seconds - claim.lease_remaining_seconds)
            if claim.renewed
            else None
        ),
        progress_ago=max(0, int(now - seconds_of(claim.progress_at))),
    )


def payload(data: bytes, limit: int = 4096) -> str:
    """Bytes for reading: UTF-8 text when they are, else a hex preview; cut at ``limit``."""
    head = data[:limit]
    try:
        text = head.decode()
    except UnicodeDecodeError:
        text = "0x" + head.hex()
    return text + (f" … ({len(data)} bytes)" if len(data) > limit else "")


PREVIEW_BYTES = 1024
"""How much of a task's input a review card shows (the task page shows up to 4 KiB)."""


def preview(data: bytes) -> str:
    """The head of an input for a card: enough to judge the result by, bounded per card."""
    return payload(data, PREVIEW_BYTES)


def position_text(position: tasks_pb2.EventPosition) -> str:
    """``revision/task_id/prev_state_version``: an event's place in the log (as the CLI's
    ``events --after`` takes it)."""
    return f"{position.revision}/{position.task_id}/{position.prev_state_version}"


def parse_position(text: str) -> tasks_pb2.EventPosition:
    """The inverse of ``position_text``; InvalidArgument for anything else."""
    revision, _, rest = text.partition("/")
    task_id, _, version = rest.rpartition("/")
    if (
        len(text) > MAX_POSITION_CHARS
        or not revision.isdigit()
        or not version.isdigit()
        or not task_id
    ):
        raise InvalidArgument(f"{text[:60]!r} is not an event position (REV/TASK/VERSION)")
    return tasks_pb2.EventPosition(
        revision=int(revision), task_id=task_id, prev_state_version=int(version)
    )
