"""Fixtures for authentication tests: a real store and a server that demands bearer tokens.

Tokens are random per test; the token file is rewritten by the tests to revoke or add tokens,
and the server checks it on every call (reload interval 0) so a reload needs no waiting.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from coordinator.server import build_server
from coordinator.server.interceptors.auth import TokenAuth
from coordinator.server.tokens import TokenFile, token_hash, write_token_file
from coordinator.store import Store

ROLES = {
    "worker-a": ["worker"],
    "worker-b": ["worker"],
    "pm-1": ["pm"],
    "admin-1": ["admin"],
}


@dataclass
class TokenRing:
    """The token file of a test and the tokens in it (principal -> token)."""

    path: Path
    tokens: dict[str, str] = field(default_factory=dict)
    roles: dict[str, list[str]] = field(default_factory=dict)
    certificates: dict[str, list[str]] = field(default_factory=dict)

    def issue(self, principal: str, roles: list[str]) -> str:
        """A new token for ``principal`` (replacing its old one); the file is rewritten."""
        self.tokens[principal] = secrets.token_urlsafe(24)
        self.roles[principal] = roles
        self.write()
        return self.tokens[principal]

    def revoke(self, principal: str) -> str:
        """Remove ``principal``'s token from the file; returns the revoked token."""
        revoked = self.tokens.pop(principal)
        self.write()
        return revoked

    def write(self, **extra: dict[str, Any]) -> None:
        """Rewrite the file (atomically, as ``coordinator token`` does)."""
        doc: dict[str, Any] = {
            "tokens": {
                token_hash(t): {"principal": p, "roles": self.roles[p]}
                for p, t in self.tokens.items()
            },
            "certificates": {p: {"roles": r} for p, r in self.certificates.items()},
        }
        for section, entries in extra.items():
            doc[section].update(entries)
        write_token_file(self.path, doc)

    def metadata(self, principal: str) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying ``principal``'s bearer token."""
        return (("authorization", f"Bearer {self.tokens[principal]}"),)


@pytest.fixture
def ring(tmp_path: Path) -> TokenRing:
    """A token file with one token per principal of ROLES."""
    ring = TokenRing(tmp_path / "tokens.json")
    for principal, roles in ROLES.items():
        ring.issue(principal, roles)
    return ring


@pytest.fixture
def secured(store: Store, ring: TokenRing) -> Iterator[str]:
    """A server for ``store`` that authenticates with ``ring``'s file; yields its target."""
    auth = TokenAuth(TokenFile(ring.path, reload_interval=0.0))
    server, port = build_server(store, listen="127.0.0.1:0", max_workers=8, auth=auth)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()


@pytest.fixture
def server(secured: str) -> str:
    """The secured server: the shared channel and stubs (tests/fixtures.py) reach it."""
    return secured


def status_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call`` fails with (the test fails if it succeeds)."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    code: grpc.StatusCode = info.value.code()
    return code
