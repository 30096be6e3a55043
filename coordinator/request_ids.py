"""Request ids: one id per logical call, carried from the SDK into the event it writes.

The SDK sends ``x-request-id`` on every call: a fresh id per logical call, the same on each of
its transport retries (coordinator.sdk._rpc). The server binds it for the handler's thread
(coordinator.server.interceptors.request_ids); the transition txn copies it into the task's event
(EventRecord.request_id) and every effect write into the effect record (EffectRecord.request_id,
coordinator.store.effects.effect), so a caller whose response was lost can find out from etcd's own
history whether its call took effect (the chaos checker does exactly that).

A caller may choose the id of its next calls with ``bound(id)`` (the chaos worker records it
before calling); otherwise the SDK makes one up. Background loops bind nothing: their events
carry "".
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

METADATA_KEY = "x-request-id"
"""The gRPC metadata key that carries a call's request id."""

MAX_LENGTH = 128
"""The longest request id kept from a caller (a longer or malformed one is not logged or stored)."""
_VALID = re.compile(rf"[A-Za-z0-9._:@/+=-]{{1,{MAX_LENGTH}}}")

_current: ContextVar[str] = ContextVar("coordinator_request_id", default="")


def new() -> str:
    """A fresh request id (32 hex characters: 128 random bits)."""
    # Not uuid4().hex: as random (all 128 bits, no version digit) without building a UUID, at
    # a fifth of the CPU; the SDK makes one per call.
    return os.urandom(16).hex()


def current() -> str:
    """The request id bound in this context, or ""."""
    return _current.get()


def is_valid(value: str) -> bool:
    """Whether ``value`` may be stored as a request id (bounded, printable, no spaces)."""
    return bool(_VALID.fullmatch(value))


@contextmanager
def bound(request_id: str) -> Iterator[str]:
    """Bind ``request_id`` for the calls (client side) or the writes (server side) made in
    this context; restored on exit."""
    token = _current.set(request_id)
    try:
        yield request_id
    finally:
        _current.reset(token)
