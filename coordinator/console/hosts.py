"""The console answers only the names it is served under (DNS rebinding).

A page of another site, DNS-rebound to 127.0.0.1, reached an insecure console (`coordinator up`
+ `console`) with its own Host header and signed in as any principal with every role. Now an
insecure console answers only loopback names (``localhost``, ``127.0.0.1``, ``::1``), and a
console with ``--allowed-host`` only those names; a request naming another host gets 400 before
any handler runs. Every form also checks that its Origin is the Host (routes/common.py
``read_form``), so the allowlist holds for Origin too. A console with tokens and no
``--allowed-host`` answers any Host (behind an ingress the name is the operator's): a rebound
page cannot sign in there without a token.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator.console.guards import SECURITY_HEADERS


def host_name(value: str) -> str:
    """The host of a Host header value (``name[:port]``, ``[v6][:port]``), lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0] if value.count(":") == 1 else value


def is_loopback_name(name: str) -> bool:
    """``localhost`` or a loopback address literal."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Which Host names a console answers: loopback only when insecure, else the configured
    names (none configured: any)."""

    def __init__(self, *, insecure: bool, allowed: Iterable[str] = ()) -> None:
        self._insecure = insecure
        self._allowed = frozenset(host_name(name) for name in allowed)

    def allows(self, name: str) -> bool:
        """Whether a request naming host ``name`` is served."""
        if self._insecure:
            return is_loopback_name(name)
        return not self._allowed or name in self._allowed


class HostGuard:
    """ASGI middleware applying a HostPolicy: 400 for a request naming another host."""

    def __init__(self, app: ASGIApp, *, policy: HostPolicy) -> None:
        self._app = app
        self._policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        host = host_name(dict(scope["headers"]).get(b"host", b"").decode("latin-1"))
        if not self._policy.allows(host):
            await _refuse(send, f"this console does not answer to host {host[:80]!r}")
            return
        await self._app(scope, receive, send)


async def _refuse(send: Send, reason: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": reason.encode() + b"\n"})
