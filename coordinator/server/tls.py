"""TLS for the gRPC port: a server certificate, and optionally mutual TLS with a client CA.

With ``client_ca`` every client must present a certificate signed by that CA (the handshake
fails otherwise); the auth interceptor then takes the principal from the certificate, by
``certificate_names``: its URI and DNS subject alternative names, and its common name only when
it has no SAN at all (RFC 6125: a certificate with SANs is not identified by its CN).

Rotation without a restart: gRPC asks for the certificate configuration at every new
connection's handshake, and the files are read again when their (inode, size, mtime) changed -
cert-manager or a Kubernetes Secret update swaps them under a running pod. A half-written or
unreadable set keeps the last good one (and says so in the log); connections already open keep
the certificate they were made with.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from coordinator.domain.roles import check_principal
from coordinator.errors import ConfigError, InvalidArgument, Unauthenticated

log = structlog.get_logger(__name__)

PeerProperties = Mapping[str, Iterable[bytes]]
"""A call's TLS peer properties as gRPC's ``auth_context()`` gives them."""

# gRPC's auth-context keys for the verified client certificate: SANs by type, all SANs, the CN.
_URI_SANS, _DNS_SANS = "peer_uri", "peer_dns"
_ANY_SAN, _COMMON_NAME = "x509_subject_alternative_name", "x509_common_name"


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
        """Server credentials that follow the files; ConfigError naming the setting if a file
        cannot be read now."""
        paths = [p for p in (self.key, self.cert, self.client_ca) if p]
        last = {"seen": _fingerprint(paths)}
        first = self._configuration()

        def fetch() -> Any:
            seen = _fingerprint(paths)
            if seen == last["seen"]:
                return None  # unchanged: gRPC keeps the current configuration
            try:
                configuration = self._configuration()
            except ConfigError as exc:  # mid-rotation: try again at the next handshake
                log.warning("TLS files changed but cannot be used yet", error=str(exc))
                return None
            last["seen"] = seen
            log.info("TLS certificate reloaded", cert=self.cert)
            return configuration

        return grpc.dynamic_ssl_server_credentials(
            first, fetch, require_client_authentication=self.mutual
        )

    def ssl_contexts(self) -> Callable[[], ssl.SSLContext]:
        """The server side of TLS for an HTTP port (metrics): call it at each new connection
        for a context that follows the files like ``credentials()`` does. Clients are not asked
        for a certificate. ConfigError naming the setting if the files cannot be used now."""
        paths = [self.key, self.cert]
        current = (_fingerprint(paths), self._ssl_context())

        def context() -> ssl.SSLContext:
            nonlocal current
            seen = _fingerprint(paths)
            if seen != current[0]:
                try:
                    current = (seen, self._ssl_context())
                    log.info("TLS certificate reloaded", cert=self.cert, port="metrics")
                except ConfigError as exc:  # mid-rotation: the last good one, try again later
                    log.warning("TLS files changed but cannot be used yet", error=str(exc))
            return current[1]

        return context

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        _read("tls_cert", self.cert)  # the same messages as for gRPC
        _read("tls_key", self.key)
        try:
            context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"tls_cert/tls_key: unusable TLS files: {exc}") from exc
        return context

    def _configuration(self) -> Any:
        """The files as one gRPC certificate configuration; ConfigError naming the setting."""
        key = _read("tls_key", self.key)
        cert = _read("tls_cert", self.cert)
        ca = _read("tls_client_ca", self.client_ca) if self.client_ca else None
        try:
            return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)
        except (RuntimeError, ValueError) as exc:
            raise ConfigError(f"tls_cert/tls_key: unusable TLS files: {exc}") from exc


def _fingerprint(paths: list[str]) -> tuple[tuple[int, int, int], ...]:
    """(inode, size, mtime) of each file; a missing one counts as changed-and-unreadable."""
    found = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            found.append((0, 0, 0))
            continue
        found.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


def _read(setting: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path!r}: {exc}") from exc
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{setting}: {path!r} is not a PEM file")
    return data


def over_tls(peer: PeerProperties) -> bool:
    """Whether the call arrived over TLS."""
    return b"ssl" in set(peer.get("transport_security_type", ()))


def certificate_names(peer: PeerProperties) -> list[str]:
    """The principals the verified client certificate may stand for, in order of preference.

    Its URI SANs, then its DNS SANs; its CN only when it has no SAN of any type. An empty list
    without a certificate. Unauthenticated if it has SANs and none is a well-formed principal
    (its CN is then not a fallback: whoever controls a CN-only name must not borrow it).
    """
    if not over_tls(peer):
        return []
    sans = _texts(peer, _URI_SANS) + _texts(peer, _DNS_SANS)
    if _texts(peer, _ANY_SAN):
        names = _principals(sans)
        if not names:
            raise Unauthenticated(
                f"the client certificate's subject alternative names {sans[:4]!r} hold no URI or "
                "DNS name usable as a principal (1-128 of [A-Za-z0-9._:@-]); its common name "
                "is not used when it has SANs"
            )
        return names
    return _principals(_texts(peer, _COMMON_NAME))


def _texts(peer: PeerProperties, key: str) -> list[str]:
    return [raw.decode(errors="replace") for raw in peer.get(key, ())]


def _principals(names: list[str]) -> list[str]:
    found: list[str] = []
    for name in names:
        try:
            principal = check_principal("certificate name", name)
        except InvalidArgument:
            continue  # e.g. a SPIFFE URI: '/' never appears in a principal (a key segment)
        if principal not in found:
            found.append(principal)
    return found
