"""Test certificates made on the spot with ``cryptography``: a CA, a server certificate for
localhost/127.0.0.1, and client certificates with a chosen CN and SANs (URI, DNS, IP). No
network, no files checked in."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pem:
    """A certificate and its key, written as PEM files."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pem:
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pem(cert_path, key_path)


class CertificateAuthority:
    """A throwaway CA that issues server and client certificates into ``directory``."""

    def __init__(self, directory: Path, name: str = "test-ca") -> None:
        self.directory = directory
        self._key = _key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.pem = _write(directory, name, self._cert, self._key)

    def issue(
        self,
        name: str,
        *,
        common_name: str,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        uris: tuple[str, ...] = (),
        server: bool = False,
    ) -> Pem:
        """A leaf certificate signed by this CA."""
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        # URIs last: the server must prefer them by type, not by their place in the list.
        names += [x509.UniformResourceIdentifier(u) for u in uris]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _write(self.directory, name, builder.sign(self._key, hashes.SHA256()), key)
