"""Where a client connects and how it authenticates: the ``COORDINATOR_*`` environment, read by
the SDK and the CLI alike.

- ``COORDINATOR_TARGET``: the coordinator, ``host:port`` (or replicas, or a DNS URI); the SDK's
  ``target``, the CLI's ``--target``; unset: ``DEFAULT_TARGET``.
- ``COORDINATOR_TOKEN``: a bearer token; ``token`` / ``--token``. Unset: the contents of the
  file ``COORDINATOR_CLIENT_TOKEN_FILE`` names (a mounted Kubernetes Secret: the chart's worker
  pool passes its token that way, never as a variable).
- ``COORDINATOR_CA``: PEM CA of the server's certificate (TLS); ``credentials`` / ``--ca``.
- ``COORDINATOR_CLIENT_CERT`` and ``COORDINATOR_CLIENT_KEY``: a PEM client certificate and its
  key (mutual TLS); ``credentials`` / ``--cert`` and ``--key``.
- ``COORDINATOR_INSECURE``: send no credentials (``coordinator up --print-env`` sets it);
  ``--insecure``. The SDK has no such argument: without credentials it sends none.

An explicit argument or flag wins over its variable; the others are still read. Settings that
contradict each other (no credentials and a token, a certificate without its key) are refused
with a message naming where each came from, so a variable left over from another shell (an
``eval "$(coordinator up --print-env)"``) is found at once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from coordinator.errors import InvalidArgument
from coordinator.sdk.auth import tls_credentials

TARGET = "COORDINATOR_TARGET"
TOKEN = "COORDINATOR_TOKEN"
CLIENT_TOKEN_FILE = "COORDINATOR_CLIENT_TOKEN_FILE"
CA = "COORDINATOR_CA"
CLIENT_CERT = "COORDINATOR_CLIENT_CERT"
CLIENT_KEY = "COORDINATOR_CLIENT_KEY"
INSECURE = "COORDINATOR_INSECURE"

DEFAULT_TARGET = "127.0.0.1:50051"
"""``coordinator up``'s and ``serve``'s default listen address."""

# click's spelling of booleans, so a variable means the same to the SDK as to the CLI.
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


@dataclass(frozen=True)
class Setting:
    """One connection setting and where it came from, as a message names it."""

    value: str
    origin: str
    """E.g. ``the environment variable COORDINATOR_TOKEN``, ``--token``, ``token=``."""


def from_environment(name: str, environ: Mapping[str, str] | None = None) -> Setting | None:
    """The variable ``name`` as a Setting; None when it is unset or empty (as click reads it)."""
    value = (os.environ if environ is None else environ).get(name, "")
    return Setting(value, f"the environment variable {name}") if value else None


def token_from_environment(environ: Mapping[str, str] | None = None) -> Setting | None:
    """``COORDINATOR_TOKEN``, else the contents of the file ``COORDINATOR_CLIENT_TOKEN_FILE``
    names (stripped); None when neither is set. InvalidArgument, naming the variable and the
    path, when that file cannot be read."""
    token = from_environment(TOKEN, environ)
    if token is not None:
        return token
    path = from_environment(CLIENT_TOKEN_FILE, environ)
    if path is None:
        return None
    try:
        value = Path(path.value).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise InvalidArgument(f"{path.origin}: cannot read {path.value!r}: {exc}") from exc
    return Setting(value, f"the file {CLIENT_TOKEN_FILE} names ({path.value})")


def is_set(setting: Setting | None) -> bool:
    """Whether a boolean setting (``COORDINATOR_INSECURE=1``) is on; InvalidArgument, naming
    it, for a value that is neither true nor false."""
    if setting is None:
        return False
    text = setting.value.strip().lower()
    if text not in _TRUE | _FALSE:
        raise InvalidArgument(f"{setting.origin}: {setting.value!r} is not a boolean (1 or 0)")
    return text in _TRUE


@dataclass(frozen=True)
class ClientSettings:
    """The credentials a client was given, each with its origin (None: not given)."""

    token: Setting | None = None
    cert: Setting | None = None
    key: Setting | None = None
    insecure: Setting | None = None

    def problem(self) -> str | None:
        """Why these settings contradict each other, naming where each came from; None if
        they do not."""
        credentials = [s.origin for s in (self.token, self.cert) if s is not None]
        insecure = self.insecure if is_set(self.insecure) else None
        if insecure is not None and credentials:
            return (
                f"{insecure.origin} says to send no credentials, but "
                f"{' and '.join(credentials)} gives some: drop one of them"
            )
        half = [s.origin for s in (self.cert, self.key) if s is not None]
        if len(half) == 1:
            return f"a client certificate and its key go together, but only {half[0]} is set"
        return None


@dataclass(frozen=True)
class Connection:
    """What a client connects to and with: the result of ``connection``."""

    target: str | Sequence[str]
    token: str | None
    credentials: grpc.ChannelCredentials | None


def connection(
    target: str | Sequence[str] | None,
    *,
    token: str | None,
    credentials: grpc.ChannelCredentials | None,
    token_given: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Connection:
    """A client's target and credentials: each argument given, else its variable
    (``COORDINATOR_TARGET`` else ``DEFAULT_TARGET``; ``COORDINATOR_TOKEN``; TLS from
    ``COORDINATOR_CA`` / ``_CLIENT_CERT`` / ``_CLIENT_KEY``). ``token_given``: the caller
    passes a token its own way (a ``BearerToken`` interceptor). InvalidArgument, naming the
    variables, when those read contradict each other or a file cannot be read."""
    env = from_environment(TARGET, environ)
    chosen_target = target if target is not None else env.value if env else DEFAULT_TARGET
    token_given = token_given or token is not None
    settings = ClientSettings(
        token=None if token_given else token_from_environment(environ),
        cert=None if credentials is not None else from_environment(CLIENT_CERT, environ),
        key=None if credentials is not None else from_environment(CLIENT_KEY, environ),
        # Read only when no credential was passed: one passed is the caller's choice.
        insecure=None
        if token_given or credentials is not None
        else from_environment(INSECURE, environ),
    )
    problem = settings.problem()
    if problem is not None:
        raise InvalidArgument(problem)
    ca = None if credentials is not None else from_environment(CA, environ)
    if ca is not None or settings.cert is not None:
        credentials = _tls(ca, settings.cert, settings.key)
    chosen_token = token if token_given else settings.token.value if settings.token else None
    return Connection(chosen_target, chosen_token, credentials)


def _tls(ca: Setting | None, cert: Setting | None, key: Setting | None) -> grpc.ChannelCredentials:
    try:
        return tls_credentials(
            ca=ca.value if ca else None,
            cert=cert.value if cert else None,
            key=key.value if key else None,
        )
    except OSError as exc:
        origins = ", ".join(s.origin for s in (ca, cert, key) if s is not None)
        raise InvalidArgument(f"cannot read a TLS file ({origins}): {exc}") from exc
