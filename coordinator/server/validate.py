"""Request checks of the gRPC layer that coordinator.domain.validation does not cover.

Every servicer validates its whole request before it calls the store, so bad input writes
nothing. Messages name the field as the .proto spells it (``fence.claim_generation``), because
the caller fixes the field, not our code. Pure: raises InvalidArgument, never does I/O.
"""

from __future__ import annotations

import math
import re

from google.protobuf.duration_pb2 import Duration

from coordinator.domain import validation
from coordinator.domain.decisions import Fence
from coordinator.domain.digests import digest_of, is_digest
from coordinator.domain.failures import FailureReport
from coordinator.domain.states import TaskState
from coordinator.errors import InvalidArgument
from coordinator.v1 import types_pb2, worker_pb2

DEFAULT_QUEUE = "default"
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def fence(message: types_pb2.Fence, *, present: bool) -> Fence:
    """The domain Fence of a worker request; every part is required except cancel_generation."""
    if not present:
        raise InvalidArgument("fence is required: send back the fence the claim returned")
    return Fence(
        task_id=validation.task_id(message.task_id, "fence.task_id"),
        attempt_id=validation.attempt_id(message.attempt_id),
        claim_generation=required_positive("fence.claim_generation", message.claim_generation),
        scheduler_epoch=epoch("fence.scheduler_epoch", message.scheduler_epoch),
        # 0 is a real value here: a task never cancelled has cancel_generation 0.
        cancel_generation=validation.non_negative(
            "fence.cancel_generation", message.cancel_generation
        ),
    )


def required_positive(field: str, value: int) -> int:
    """A required integer > 0, where 0 means the caller left it out."""
    if value == 0:
        raise InvalidArgument(f"{field} is required (must be > 0)")
    return validation.positive(field, value)


def epoch(field: str, value: int) -> int:
    """The scheduler epoch a worker believes in; it never defaults, or fencing by epoch is moot."""
    if value == 0:
        raise InvalidArgument(
            f"{field} is required: missing epoch (read it with AdminService.GetEpoch)"
        )
    return validation.positive(field, value)


def ttl(field: str, value: int) -> int:
    """A requested lease TTL in seconds (> 0); the store clamps it to the server's bounds."""
    return validation.positive(field, value)


def digest(field: str, value: str) -> str:
    """A required, well-formed ``sha256:<64 lowercase hex>`` digest."""
    if not value:
        raise InvalidArgument(f"{field} is required")
    if not is_digest(value):
        raise InvalidArgument(
            f"{field} must be 'sha256:' followed by 64 lowercase hex digits, got {value[:80]!r}"
        )
    return value


def content_digest(field: str, value: str, data: bytes) -> str:
    """The digest of inline ``data``: computed when empty, else it must be the data's digest.

    Unlike domain.digests.check_digest this also compares against empty data: a digest that
    names other bytes than the ones sent is a wrong request, whatever their length.
    """
    if not value:
        return digest_of(data)
    digest(field, value)
    if digest_of(data) != value:
        raise InvalidArgument(f"{field} {value} is not the sha256 of the bytes sent")
    return value


def input_payload(field: str, data: bytes, input_digest: str) -> str:
    """Check a task input and its digest; returns the digest to store."""
    validation.max_bytes(field, data, validation.MAX_INPUT_BYTES)
    return content_digest("input_digest", input_digest, data)


def result_payload(result: bytes, result_digest: str, result_ref: str) -> str:
    """Check an inline result and/or a reference to one; returns the result digest.

    With only a reference the digest is required (the bytes are elsewhere and cannot be
    hashed here); with inline bytes it must be theirs.
    """
    validation.max_bytes("result", result, validation.MAX_RESULT_BYTES)
    validation.text("result_ref", result_ref, validation.MAX_REF_CHARS)
    if result_ref and not result:
        return digest("result_digest", result_digest)
    return content_digest("result_digest", result_digest, result)


MAX_ERROR_DETAILS = 16 * 1024
MAX_REQUEUE_DELAY = 86400.0
_ERROR_CODE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def error_code(field: str, value: str) -> str:
    """An error code a worker reports (an exception type, an error name)."""
    if not value:
        raise InvalidArgument(f"{field} is required (an error name such as 'TimeoutError')")
    if not _ERROR_CODE.fullmatch(value):
        raise InvalidArgument(
            f"{field} must be 1-128 characters of [A-Za-z0-9._:-], got {value[:140]!r}"
        )
    return value


def seconds(field: str, value: Duration, *, present: bool, limit: float) -> float:
    """An optional non-negative duration of at most ``limit`` seconds (unset: 0)."""
    if not present:
        return 0.0
    if value.seconds < 0 or value.nanos < 0:
        raise InvalidArgument(f"{field} must be >= 0, got {value.ToTimedelta()}")
    total = value.ToNanoseconds() / 1e9
    if total > limit:
        raise InvalidArgument(f"{field} must be at most {limit:g} s, got {total:g} s")
    return total


def failure_report(request: worker_pb2.FailRequest) -> FailureReport:
    """The checked report of a FailRequest (every field bounded)."""
    return FailureReport(
        retryable=request.retryable,
        code=error_code("error_code", request.error_code),
        message=validation.text("error_message", request.error_message),
        details=validation.max_bytes("error_details", request.error_details, MAX_ERROR_DETAILS),
        delay=seconds(
            "requeue_delay",
            request.requeue_delay,
            present=request.HasField("requeue_delay"),
            limit=MAX_REQUEUE_DELAY,
        ),
    )


def wait_seconds(value: float, limit: float) -> float:
    """A long poll's wait: 0 (none) to the server's ``limit``."""
    if not (math.isfinite(value) and 0 <= value <= limit):
        raise InvalidArgument(
            f"wait_seconds must be 0 to {limit:g} (max_claim_wait), got {value:g}"
        )
    return value


def optional_task_id(value: str) -> str:
    """A task id to create; empty lets the store generate one."""
    return validation.task_id(value) if value else ""


def queue_or_default(value: str) -> str:
    """A queue name; empty means the default queue."""
    return validation.queue(value) if value else DEFAULT_QUEUE


def queue_filter(value: str) -> str:
    """A queue to filter by; empty means every queue."""
    return validation.queue(value) if value else ""


def state_filter(value: int) -> TaskState | None:
    """A task state to filter by; TASK_STATE_UNSPECIFIED (0) means every state."""
    if value == 0:
        return None
    try:
        return TaskState(value)
    except ValueError:
        raise InvalidArgument(f"state {value} is not a known TaskState") from None


def page_size(value: int) -> int:
    """A page size in 1-1000; 0 means the default of 100."""
    if value == 0:
        return DEFAULT_PAGE_SIZE
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise InvalidArgument(
            f"page_size must be between 1 and {MAX_PAGE_SIZE} (0 means {DEFAULT_PAGE_SIZE}), "
            f"got {value}"
        )
    return value


def page_token(value: str) -> str:
    """A page token as returned by ListTasks (the last task id of the previous page)."""
    return validation.task_id(value, "page_token") if value else ""


def attempt_page_token(value: str) -> int:
    """A ListAttempts page token (the attempt number the page starts at); empty: the first."""
    if not value:
        return 1
    if not value.isdigit() or len(value) > 9 or int(value) < 1:
        raise InvalidArgument(
            f"page_token {value[:40]!r} is not one ListAttempts returned (an attempt number)"
        )
    return int(value)


def text(field: str, value: str) -> str:
    """A free-text field (reason, tool, action, progress) of bounded length."""
    return validation.text(field, value)
