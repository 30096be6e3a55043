"""TLS for the gRPC port: a server certificate, and optionally mutual TLS with a client CA.

With ``client_ca`` every client must present a certificate signed by that CA (the handshake
fails otherwise); the auth interceptor then takes the principal from the certificate. Files are
read once at start: a rotated certificate takes effect on the next rollout of the pods.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from coordinator.errors import ConfigError


@dataclass(frozen=True)
class ServerTLS:
    """PEM files of the server's TLS identity, and of the CA that signs client certificates."""

    cert: str
    key: str
    client_ca: str | None = None

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return self.client_ca is not None

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials; ConfigError naming the setting if a file cannot be read."""
        key = _read("tls_key", self.key)
        cert = _read("tls_cert", self.cert)
        ca = _read("tls_client_ca", self.client_ca) if self.client_ca else None
        try:
            return grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
            )
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"tls_cert/tls_key: unusable TLS files: {exc}") from exc


def _read(setting: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path!r}: {exc}") from exc
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{setting}: {path!r} is not a PEM file")
    return data
