"""Idempotency keys: when a keyed request runs, replays, or is refused (pure, no I/O).

A caller may send ``idempotency-key`` with any mutating call. The first request with a key
reserves ``{prefix}/idem/{principal}/{key}``, runs, and stores its response; the same request
again gets that stored response without running; a different request under the same key is a
conflict. Keys are scoped to the calling principal and expire (see store/control/idempotency.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from coordinator.errors import InvalidArgument

IDEMPOTENCY_METADATA_KEY = "idempotency-key"
"""gRPC metadata key carrying a request's idempotency key."""

_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class IdemState(IntEnum):
    """Where a keyed request stands."""

    PENDING = 1  # reserved; the first request is running
    DONE = 2  # its response is stored


@dataclass(frozen=True)
class IdemRecord:
    """The value under ``{prefix}/idem/{principal}/{key}``."""

    method: str
    request_digest: str
    state: IdemState
    at: float
    response: bytes = b""
    # etcd mod_revision of the key; never stored, attached on decode.
    mod_revision: int = field(default=0, compare=False)


class IdemAction(Enum):
    """What to do with a keyed request."""

    RUN = "run"  # nothing stored under the key: reserve it and run
    REPLAY = "replay"  # the same request ran: return its stored response
    IN_FLIGHT = "in_flight"  # the same request is running right now
    CONFLICT = "conflict"  # the key was used for a different request


def idempotency_key(value: str) -> str:
    """A well-formed key: 1-128 characters of ``[A-Za-z0-9._:-]``."""
    if not _KEY.fullmatch(value):
        raise InvalidArgument(
            f"{IDEMPOTENCY_METADATA_KEY} must be 1-128 characters of [A-Za-z0-9._:-], "
            f"got {value[:140]!r}"
        )
    return value


def request_digest(method: str, request: bytes) -> str:
    """What makes two requests "the same": the method and the request's canonical bytes."""
    digest = hashlib.sha256()
    digest.update(method.encode())
    digest.update(b"\0")
    digest.update(request)
    return "sha256:" + digest.hexdigest()


def decide(existing: IdemRecord | None, *, method: str, digest: str) -> IdemAction:
    """The action for a request with ``digest`` when ``existing`` is stored under its key."""
    if existing is None:
        return IdemAction.RUN
    if existing.method != method or existing.request_digest != digest:
        return IdemAction.CONFLICT
    if existing.state is IdemState.PENDING:
        return IdemAction.IN_FLIGHT
    return IdemAction.REPLAY


def conflict_message(key: str, existing: IdemRecord, method: str) -> str:
    """Why a reused key is refused, naming what it was first used for."""
    if existing.method != method:
        return (
            f"idempotency key {key!r} was already used for {existing.method}; this call is "
            f"{method}: use a new key for a new request"
        )
    return (
        f"idempotency key {key!r} was already used for a different {method} request "
        f"({existing.request_digest}); use a new key for a new request"
    )
