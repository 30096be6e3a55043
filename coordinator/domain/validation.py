"""Request validation shared by every entry point (pure; raises InvalidArgument)."""

from __future__ import annotations

import re

from coordinator.errors import InvalidArgument

MAX_INPUT_BYTES = 256 * 1024
MAX_RESULT_BYTES = 512 * 1024
MAX_CHECKPOINT_BYTES = 64 * 1024  # kept with its attempt and handed to the next
MAX_REF_CHARS = 2048
MAX_TEXT_CHARS = 1024

_TASK_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_QUEUE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ATTEMPT_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_ERROR_CODE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_DOT_SEGMENTS = frozenset({".", ".."})

# protobuf's own ranges (google/protobuf/timestamp.proto and duration.proto): a value outside
# them is no Timestamp or Duration at all, whatever the field. Checked before any arithmetic, so
# a hostile value never reaches datetime/timedelta (which raise, and answered INTERNAL).
TIMESTAMP_MIN_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z."""
TIMESTAMP_MAX_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z."""
DURATION_MAX_SECONDS = 315_576_000_000
"""About 10,000 years, either sign."""
MAX_NANOS = 999_999_999


def no_dot_segments(field: str, value: str) -> str:
    """``value`` unless it, or any of its ``/``-separated parts, is ``.`` or ``..``.

    Ids become etcd key segments and, in the SDK and in tools, file paths and URLs, where
    ``.`` and ``..`` name the same place or the parent: a task ``..`` would put a managed job's
    log outside its directory, and ``a/../b`` would alias ``b``.
    """
    if any(part in _DOT_SEGMENTS for part in value.split("/")):
        raise InvalidArgument(
            f"{field} must not be '.' or '..' (nor have one as a '/'-separated part), "
            f"got {value[:80]!r}"
        )
    return value


def task_id(value: str, field: str = "task_id") -> str:
    """A task id: 1-128 characters of [A-Za-z0-9._:-], not ``.`` or ``..``."""
    if not value:
        raise InvalidArgument(f"{field} is required")
    if not _TASK_ID.fullmatch(value):
        raise InvalidArgument(
            f"{field} must be 1-128 characters of [A-Za-z0-9._:-], got {value[:140]!r}"
        )
    return no_dot_segments(field, value)


def queue(value: str) -> str:
    """A queue name: 1-64 characters of [A-Za-z0-9._-], not ``.`` or ``..``."""
    if not _QUEUE.fullmatch(value):
        raise InvalidArgument(
            f"queue must be 1-64 characters of [A-Za-z0-9._-], got {value[:80]!r}"
        )
    return no_dot_segments("queue", value)


def attempt_id(value: str) -> str:
    """An attempt id as issued by a claim."""
    if not value:
        raise InvalidArgument("fence.attempt_id is required")
    if not _ATTEMPT_ID.fullmatch(value):
        raise InvalidArgument(f"fence.attempt_id is malformed: {value[:80]!r}")
    return value


def positive(field: str, value: int) -> int:
    """A required positive integer (epochs, generations, TTLs)."""
    if value <= 0:
        raise InvalidArgument(f"{field} must be > 0, got {value}")
    return value


def non_negative(field: str, value: int) -> int:
    """An optional non-negative integer (0 = not set)."""
    if value < 0:
        raise InvalidArgument(f"{field} must be >= 0, got {value}")
    return value


def priority(value: int) -> int:
    """A priority in 0-999 (higher runs first)."""
    if not 0 <= value <= 999:
        raise InvalidArgument(f"priority must be between 0 and 999, got {value}")
    return value


def max_bytes(field: str, data: bytes, limit: int) -> bytes:
    """A payload no larger than ``limit`` bytes."""
    if len(data) > limit:
        raise InvalidArgument(f"{field} is {len(data)} bytes, the limit is {limit}")
    return data


def text(field: str, value: str, limit: int = MAX_TEXT_CHARS) -> str:
    """A free-text field no longer than ``limit`` characters."""
    if len(value) > limit:
        raise InvalidArgument(f"{field} is {len(value)} characters, the limit is {limit}")
    return value


def error_code(value: str, field: str = "error_code") -> str:
    """An error code a worker reports (an exception type, an error name such as 'BadInput')."""
    if not value:
        raise InvalidArgument(f"{field} is required (an error name such as 'TimeoutError')")
    if not _ERROR_CODE.fullmatch(value):
        raise InvalidArgument(
            f"{field} must be 1-128 characters of [A-Za-z0-9._:-] (a name, not a sentence: put "
            f"the sentence in the message), got {value[:140]!r}"
        )
    return value


def timestamp(field: str, seconds: int, nanos: int) -> float:
    """Seconds since the epoch of a Timestamp that keeps protobuf's rules (0001-01-01 to
    9999-12-31, nanos 0 to 999,999,999); the field's own bounds are its parser's."""
    if not TIMESTAMP_MIN_SECONDS <= seconds <= TIMESTAMP_MAX_SECONDS:
        raise InvalidArgument(
            f"{field} is not a valid Timestamp: seconds must be {TIMESTAMP_MIN_SECONDS} to "
            f"{TIMESTAMP_MAX_SECONDS} (0001-01-01 to 9999-12-31), got {seconds}"
        )
    if not 0 <= nanos <= MAX_NANOS:
        raise InvalidArgument(
            f"{field} is not a valid Timestamp: nanos must be 0 to {MAX_NANOS}, got {nanos}"
        )
    return seconds + nanos / 1e9


def duration(field: str, seconds: int, nanos: int) -> float:
    """Seconds of a Duration that keeps protobuf's rules (at most 315,576,000,000 s either
    way, |nanos| at most 999,999,999, nanos of the sign of seconds); the field's own bounds are
    its parser's."""
    if not -DURATION_MAX_SECONDS <= seconds <= DURATION_MAX_SECONDS:
        raise InvalidArgument(
            f"{field} is not a valid Duration: seconds must be -{DURATION_MAX_SECONDS} to "
            f"{DURATION_MAX_SECONDS}, got {seconds}"
        )
    if not -MAX_NANOS <= nanos <= MAX_NANOS:
        raise InvalidArgument(
            f"{field} is not a valid Duration: nanos must be -{MAX_NANOS} to {MAX_NANOS}, "
            f"got {nanos}"
        )
    # {1 s, -5 ns} is no duration: protobuf keeps the parts of one sign (-1.5 s is {-1, -5e8}).
    if (seconds > 0 and nanos < 0) or (seconds < 0 and nanos > 0):
        raise InvalidArgument(
            f"{field} is not a valid Duration: nanos ({nanos}) must have the sign of seconds "
            f"({seconds})"
        )
    return seconds + nanos / 1e9
