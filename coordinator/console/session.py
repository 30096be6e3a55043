"""The signed-in person, kept in the signed session cookie: their credentials, a per-session
CSRF token, and the outcome of their last action (shown once, after the redirect).

Starlette's SessionMiddleware signs the cookie (itsdangerous, with an expiry) and marks it
HttpOnly and SameSite=Strict; this module only decides what goes in it.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from coordinator.console.signed_out import SignedOut
from coordinator.domain.roles import check_principal
from coordinator.errors import InvalidArgument

_CSRF, _TOKEN, _PRINCIPAL, _FLASH = "csrf", "token", "principal", "flash"
_ID, _SIGNED_IN_AT = "sid", "signed_in_at"
# Bearer tokens the coordinator issues are ~32 characters; anything this long is not one.
MAX_TOKEN_CHARS = 512
# A flash is a server message (a status line); kept short so the cookie stays small.
MAX_FLASH_CHARS = 600
INSECURE_PRINCIPAL = "console"
"""What the console's own gRPC metadata names in token mode (the server takes the principal
from the token and ignores it)."""


@dataclass(frozen=True)
class Credentials:
    """Who the console calls the coordinator as: a bearer token, or (insecure servers) only a
    principal name."""

    principal: str
    token: str | None = None

    @property
    def label(self) -> str:
        """How the page names the signed-in person (never the whole token)."""
        if self.token is None:
            return self.principal
        return f"token …{self.token[-4:]}"


@dataclass(frozen=True)
class Flash:
    """The typed outcome of one action: ``ok`` false for a refusal (with its status code)."""

    ok: bool
    text: str


def token_credentials(text: str) -> Credentials:
    """A pasted bearer token, or InvalidArgument saying what is wrong with it."""
    token = text.strip()
    if not token or len(token) > MAX_TOKEN_CHARS or any(c.isspace() for c in token):
        raise InvalidArgument(
            f"a token is 1-{MAX_TOKEN_CHARS} characters without spaces (paste it whole)"
        )
    return Credentials(principal=INSECURE_PRINCIPAL, token=token)


def principal_credentials(text: str) -> Credentials:
    """A principal name (insecure servers only), or InvalidArgument."""
    return Credentials(principal=check_principal("principal", text.strip()))


def csrf_token(request: Request) -> str:
    """This session's CSRF token, created on first use (also before sign-in: the sign-in form
    is protected too)."""
    session: dict[str, Any] = request.session
    if _CSRF not in session:
        session[_CSRF] = secrets.token_urlsafe(32)
    return str(session[_CSRF])


def csrf_matches(request: Request, submitted: str) -> bool:
    """Whether a form's token is this session's (constant-time)."""
    expected = request.session.get(_CSRF)
    return isinstance(expected, str) and hmac.compare_digest(expected, submitted)


def current(request: Request, ended: SignedOut) -> Credentials | None:
    """The signed-in person's credentials, or None (also for a session that signed out, or
    one from before session ids: its cookie is forgotten)."""
    principal = request.session.get(_PRINCIPAL)
    if not isinstance(principal, str):
        return None
    session_id, signed_in_at = request.session.get(_ID), request.session.get(_SIGNED_IN_AT)
    if not isinstance(session_id, str) or not isinstance(signed_in_at, (int, float)):
        request.session.clear()
        return None
    if ended.is_ended(session_id, float(signed_in_at)):
        request.session.clear()
        return None
    token = request.session.get(_TOKEN)
    return Credentials(principal=principal, token=token if isinstance(token, str) else None)


def sign_in(request: Request, credentials: Credentials) -> None:
    """Start a fresh session for ``credentials`` (a new CSRF token too: nothing carried over
    from before sign-in)."""
    request.session.clear()
    request.session[_ID] = secrets.token_urlsafe(16)
    request.session[_SIGNED_IN_AT] = time.time()
    request.session[_PRINCIPAL] = credentials.principal
    if credentials.token is not None:
        request.session[_TOKEN] = credentials.token
    csrf_token(request)


def sign_out(request: Request, ended: SignedOut) -> None:
    """End the session: the cookie is cleared, and a copy of it is refused from now on."""
    session_id, signed_in_at = request.session.get(_ID), request.session.get(_SIGNED_IN_AT)
    if isinstance(session_id, str) and isinstance(signed_in_at, (int, float)):
        ended.end(session_id, float(signed_in_at))
    request.session.clear()


def set_flash(request: Request, flash: Flash) -> None:
    """Keep an action's outcome for the next page."""
    text = flash.text if len(flash.text) <= MAX_FLASH_CHARS else flash.text[:MAX_FLASH_CHARS] + "…"
    request.session[_FLASH] = {"ok": flash.ok, "text": text}


def pop_flash(request: Request) -> Flash | None:
    """The last action's outcome, once."""
    data = request.session.pop(_FLASH, None)
    if not isinstance(data, dict):
        return None
    return Flash(ok=bool(data.get("ok")), text=str(data.get("text", "")))
