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

from coordinator.errors import AlreadyExists, InvalidArgument

IDEMPOTENCY_METADATA_KEY = "idempotency-key"
"""gRPC metadata key carrying a request's idempotency key."""

_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class KeyReused(AlreadyExists):
    """The idempotency key was already used for a different request."""


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


@dataclass(frozen=True)
class Grant:
    """One claim a keyed ClaimNext was answered with: the task and attempt it names, and what
    the answer said of its lease clock (the rest is read back from the claim's own records)."""

    task_id: str
    attempt_id: str
    lease_expires_at: float
    lease_remaining: float
    message: str = ""


@dataclass(frozen=True)
class KeyedClaims:
    """The value under ``{prefix}/keyed-claims/{principal}/{key}``: the claims a keyed
    ClaimNext won, written by its claim txns themselves (store/claims/claim_keys.py). The
    grants are stored field by field (parallel tuples: records hold no nested records)."""

    method: str
    request_digest: str
    task_ids: tuple[str, ...] = ()
    attempt_ids: tuple[str, ...] = ()
    lease_expires_at: tuple[float, ...] = ()
    lease_remaining: tuple[float, ...] = ()
    messages: tuple[str, ...] = ()
    # etcd mod_revision of the key; never stored, attached on decode.
    mod_revision: int = field(default=0, compare=False)

    def grants(self) -> list[Grant]:
        """The claims, in the order the answer gave them."""
        return [
            Grant(*fields)
            for fields in zip(
                self.task_ids,
                self.attempt_ids,
                self.lease_expires_at,
                self.lease_remaining,
                self.messages,
                strict=True,
            )
        ]

    def with_grant(self, grant: Grant) -> KeyedClaims:
        """This record with ``grant`` added last."""
        return KeyedClaims(
            self.method,
            self.request_digest,
            (*self.task_ids, grant.task_id),
            (*self.attempt_ids, grant.attempt_id),
            (*self.lease_expires_at, grant.lease_expires_at),
            (*self.lease_remaining, grant.lease_remaining),
            (*self.messages, grant.message),
        )


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


def decide(existing: IdemRecord | KeyedClaims | None, *, method: str, digest: str) -> IdemAction:
    """The action for a request with ``digest`` when ``existing`` is stored under its key."""
    if existing is None:
        return IdemAction.RUN
    if existing.method != method or existing.request_digest != digest:
        return IdemAction.CONFLICT
    if isinstance(existing, IdemRecord) and existing.state is IdemState.PENDING:
        return IdemAction.IN_FLIGHT
    return IdemAction.REPLAY


def conflict_message(key: str, existing: IdemRecord | KeyedClaims, method: str) -> str:
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
