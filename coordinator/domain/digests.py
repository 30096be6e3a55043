"""Content digests: the "sha256:<64 lowercase hex>" form used for inputs, results and payloads."""

from __future__ import annotations

import hashlib
import re

from coordinator.errors import InvalidArgument

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def digest_of(data: bytes) -> str:
    """The canonical digest of ``data``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def is_digest(value: str) -> bool:
    """Whether ``value`` is a well-formed digest."""
    return bool(_DIGEST.fullmatch(value))


def check_digest(field: str, value: str, *, data: bytes | None = None) -> str:
    """Validate a digest field; if ``data`` is given, the digest must be of ``data``.

    An empty ``value`` with ``data`` given is filled in from the data.
    """
    if not value and data is not None:
        return digest_of(data)
    if not is_digest(value):
        raise InvalidArgument(
            f"{field} must be 'sha256:' followed by 64 lowercase hex digits, got {value[:80]!r}"
        )
    if data is not None and digest_of(data) != value:
        raise InvalidArgument(f"{field} {value} is not the sha256 of the bytes sent")
    return value
