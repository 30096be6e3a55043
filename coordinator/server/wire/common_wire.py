"""Wire conversions every area shares: times, enums, and the checks of common scalar fields.

Each area of the API has its own ``<area>_wire`` module (task_wire, worker_wire, effect_wire,
job_wire, event_wire, queue_wire, admin_wire) of the same shape: ``parse_*`` turns a request
field into a domain value or raises InvalidArgument naming the field as the .proto spells it
(``fence.claim_generation``, because the caller fixes the field, not our code); ``*_to_proto``
turns a domain value into its message. Pure and mechanical: no rules, no I/O. A whole request
is parsed in one place, the ``parse_<rpc>`` of its service's ``*_requests`` module, which the
servicer calls before anything else, so bad input writes nothing.

Domain enums have the wire enums' integer values (coordinator.domain.states), so enums convert
by value; times are float seconds in the domain and Timestamps on the wire, where 0.0 (never
happened) becomes an unset field.
"""

from __future__ import annotations

from typing import TypedDict

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from coordinator.domain import validation
from coordinator.domain.decisions import Verdict
from coordinator.domain.digests import digest_of, is_digest
from coordinator.domain.states import FenceReason, Outcome, TaskState
from coordinator.errors import InvalidArgument
from coordinator.v1 import types_pb2

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000

# --- domain -> proto -------------------------------------------------------------------------


class VerdictFields(TypedDict):
    """The outcome, reason and message of a verdict, as a response's keyword arguments."""

    outcome: types_pb2.Outcome.ValueType
    reason: types_pb2.FenceReason.ValueType
    message: str


def verdict_fields(verdict: Verdict) -> VerdictFields:
    """What every acceptance-point response says of the store's verdict:
    ``Response(**verdict_fields(verdict), ...)``."""
    return VerdictFields(
        outcome=outcome_to_proto(verdict.outcome),
        reason=reason_to_proto(verdict.reason),
        message=verdict.message,
    )


def timestamp_to_proto(seconds: float) -> Timestamp | None:
    """A Timestamp for ``seconds`` since the epoch; None (unset) for 0."""
    if not seconds:
        return None
    ts = Timestamp()
    ts.FromNanoseconds(round(seconds * 1e9))
    return ts


def task_state_to_proto(state: TaskState | None) -> types_pb2.TaskState.ValueType:
    """The wire TaskState (UNSPECIFIED for None)."""
    return types_pb2.TaskState.ValueType(int(state) if state is not None else 0)


def outcome_to_proto(value: Outcome) -> types_pb2.Outcome.ValueType:
    """The wire Outcome."""
    return types_pb2.Outcome.ValueType(int(value))


def reason_to_proto(value: FenceReason) -> types_pb2.FenceReason.ValueType:
    """The wire FenceReason (NONE is UNSPECIFIED)."""
    return types_pb2.FenceReason.ValueType(int(value))


# --- proto -> domain -------------------------------------------------------------------------


def parse_required_positive(field: str, value: int) -> int:
    """A required integer > 0, where 0 means the caller left it out."""
    if value == 0:
        raise InvalidArgument(f"{field} is required (must be > 0)")
    return validation.positive(field, value)


def parse_epoch(field: str, value: int) -> int:
    """The scheduler epoch a worker believes in; it never defaults, or fencing by epoch is moot."""
    if value == 0:
        raise InvalidArgument(
            f"{field} is required: missing epoch (read it with AdminService.GetEpoch)"
        )
    return validation.positive(field, value)


def parse_digest(field: str, value: str) -> str:
    """A required, well-formed ``sha256:<64 lowercase hex>`` digest."""
    if not value:
        raise InvalidArgument(f"{field} is required")
    if not is_digest(value):
        raise InvalidArgument(
            f"{field} must be 'sha256:' followed by 64 lowercase hex digits, got {value[:80]!r}"
        )
    return value


def parse_content_digest(field: str, value: str, data: bytes) -> str:
    """The digest of inline ``data``: computed when empty, else it must be the data's digest.

    Unlike domain.digests.check_digest this also compares against empty data: a digest that
    names other bytes than the ones sent is a wrong request, whatever their length.
    """
    if not value:
        return digest_of(data)
    parse_digest(field, value)
    if digest_of(data) != value:
        raise InvalidArgument(f"{field} {value} is not the sha256 of the bytes sent")
    return value


def parse_error_code(field: str, value: str) -> str:
    """An error code a worker reports (an exception type, an error name)."""
    return validation.error_code(value, field)


def parse_timestamp(field: str, value: Timestamp) -> float:
    """Seconds since the epoch of a Timestamp field, refused unless it keeps protobuf's rules;
    every Timestamp a request carries goes through here before its field's own bounds."""
    return validation.timestamp(field, value.seconds, value.nanos)


def parse_duration(
    field: str,
    value: Duration,
    *,
    at_least: float = 0.0,
    at_most: float | None = None,
    note: str = "",
) -> float:
    """Seconds of a Duration field: protobuf's rules, then the field's bounds (``at_least`` to
    ``at_most`` seconds; ``note`` says the upper bound in words). Every Duration a request
    carries goes through here."""
    seconds = validation.duration(field, value.seconds, value.nanos)
    if at_most is None:
        if seconds < at_least:
            raise InvalidArgument(f"{field} must be >= {at_least:g} s, got {seconds:g} s")
    elif not at_least <= seconds <= at_most:
        raise InvalidArgument(
            f"{field} must be {at_least:g} s to {at_most:.0f} s{note}, got {seconds:g} s"
        )
    return seconds


def parse_text(field: str, value: str) -> str:
    """A free-text field (reason, tool, action, progress) of bounded length."""
    return validation.text(field, value)


def parse_page_size(value: int) -> int:
    """A page size in 1-1000; 0 means the default of 100."""
    if value == 0:
        return DEFAULT_PAGE_SIZE
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise InvalidArgument(
            f"page_size must be between 1 and {MAX_PAGE_SIZE} (0 means {DEFAULT_PAGE_SIZE}), "
            f"got {value}"
        )
    return value
