"""ASGI middleware that bounds every request and hardens every response: a body larger than
the console's bound is refused 413 before a handler reads it, and pages carry a strict
Content-Security-Policy (own scripts and styles only), no framing, no MIME sniffing."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class BodyTooLarge(Exception):
    """The request body went past the bound while it was being read."""


class Guards:
    """Refuse bodies over ``max_body_bytes`` (declared or streamed); add SECURITY_HEADERS."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self._app = app
        self._max = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._max):
            await _too_large(send, self._max)
            return
        seen = 0
        started = False

        async def bounded_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max:
                    raise BodyTooLarge
            return message

        async def hardened_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        try:
            await self._app(scope, bounded_receive, hardened_send)
        except BodyTooLarge:
            if not started:
                await _too_large(send, self._max)


async def _too_large(send: Send, limit: int) -> None:
    body = f"request body over {limit} bytes: the console's forms are far smaller\n".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": body})
