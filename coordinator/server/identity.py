"""Who is calling: the authenticated Identity the auth interceptor established for this call.

The interceptor (coordinator.server.interceptors.auth) authenticates every call before its
handler runs and runs the handler inside a context where ``identity_of`` returns the caller.
Servicers ask ``identity_of`` / ``principal_of`` and nothing else: the owner of a claim is always
the authenticated principal, never a request field.
"""

from __future__ import annotations

from contextvars import ContextVar

import grpc

from coordinator.domain.roles import Identity
from coordinator.errors import Unauthenticated

PRINCIPAL_METADATA_KEY = "x-coordinator-principal"
"""Insecure mode only: gRPC metadata key naming the caller's principal (lower case for gRPC)."""

ROLES_METADATA_KEY = "x-coordinator-roles"
"""Insecure mode only: metadata key with the caller's roles as a comma list (default: all)."""

AUTHORIZATION_METADATA_KEY = "authorization"
"""Bearer tokens arrive as ``authorization: Bearer <token>``."""

ANONYMOUS = "anonymous"
"""Insecure mode: the principal of a caller that names none."""

CURRENT_IDENTITY: ContextVar[Identity | None] = ContextVar("coordinator_identity", default=None)
"""Set by the auth interceptor around each handler; read through ``identity_of``."""


def identity_of(context: grpc.ServicerContext) -> Identity:
    """The authenticated caller of the current call.

    ``context`` is accepted for the servicers' convenience (and future per-call data); the
    identity itself lives in a context variable the interceptor set. Without one the call did
    not pass the interceptor: refuse (fail closed) rather than guess an owner.
    """
    del context
    identity = CURRENT_IDENTITY.get()
    if identity is None:
        raise Unauthenticated("no authenticated identity for this call (auth interceptor missing)")
    return identity


def principal_of(context: grpc.ServicerContext) -> str:
    """The caller's principal: the owner of every claim it makes."""
    return identity_of(context).principal
