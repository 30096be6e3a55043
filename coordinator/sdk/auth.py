"""Client-side credentials: a bearer token on every call, and TLS (mutual with a client cert).

    client = WorkerClient(
        "coordinator.example:50051",
        principal="worker-1",
        token=token,  # not given: COORDINATOR_TOKEN (sdk/environment.py)
        credentials=tls_credentials(ca="ca.pem"),  # not given: COORDINATOR_CA, ...
    )

The token rides in ``authorization: Bearer <token>`` metadata, added by a client interceptor
rather than gRPC call credentials so it also works on a plaintext channel behind a mesh that
encrypts (grpc refuses call credentials on insecure channels). Without TLS or such a mesh the
token crosses the network in clear: use TLS.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import grpc

from coordinator.errors import InvalidArgument

AUTHORIZATION = "authorization"


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


def bearer_header(token: str) -> tuple[str, str]:
    """The ``authorization`` metadata entry of ``token``; InvalidArgument for a malformed one."""
    token = token.strip()
    if not token or any(c.isspace() for c in token):
        raise InvalidArgument("token must be a non-empty string without whitespace")
    return (AUTHORIZATION, f"Bearer {token}")


class BearerToken(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds ``authorization: Bearer <token>`` to every unary and server-streaming call."""

    def __init__(self, token: str) -> None:
        self._header = bearer_header(token)

    def _with_token(self, details: Any) -> _Details:
        metadata = [m for m in (details.metadata or ()) if m[0] != AUTHORIZATION]
        return _Details(
            details.method,
            details.timeout,
            [*metadata, self._header],
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        """Send the unary call with the token."""
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[[Any, Any], Any], client_call_details: Any, request: Any
    ) -> Any:
        """Send the server-streaming call with the token."""
        return continuation(self._with_token(client_call_details), request)


def tls_credentials(
    *, ca: str | Path | None = None, cert: str | Path | None = None, key: str | Path | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files: ``ca`` to verify the server (system roots if
    None), and ``cert`` + ``key`` for mutual TLS."""
    if (cert is None) != (key is None):
        raise InvalidArgument("cert and key go together (mutual TLS needs both)")

    def read(path: str | Path | None) -> bytes | None:
        return Path(path).read_bytes() if path is not None else None

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca), private_key=read(key), certificate_chain=read(cert)
    )
