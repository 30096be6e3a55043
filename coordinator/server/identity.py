"""Who is calling: the principal that owns the claims it makes.

Authentication arrives later (bearer tokens, mTLS). Until then the principal is taken from the
``x-coordinator-principal`` metadata key, which any client can set: this is the one place the
auth interceptor will replace, so every servicer asks ``principal_of`` and nothing else.
"""

from __future__ import annotations

import re

import grpc

from coordinator.errors import InvalidArgument

PRINCIPAL_METADATA_KEY = "x-coordinator-principal"
"""gRPC metadata key carrying the caller's principal (lower case, as gRPC requires)."""

ANONYMOUS = "anonymous"
"""The principal of a caller that names none."""

_PRINCIPAL = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")


def principal_of(context: grpc.ServicerContext) -> str:
    """The caller's principal; ``anonymous`` when the metadata key is absent.

    A present but malformed value is refused (INVALID_ARGUMENT) rather than mapped to anonymous:
    silently acting as someone else would hand the caller another principal's claims.
    """
    for key, value in context.invocation_metadata() or ():
        if key != PRINCIPAL_METADATA_KEY:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if not _PRINCIPAL.fullmatch(text):
            raise InvalidArgument(
                f"{PRINCIPAL_METADATA_KEY} must be 1-128 characters of [A-Za-z0-9._:@-], "
                f"got {text[:140]!r}"
            )
        return text
    return ANONYMOUS
