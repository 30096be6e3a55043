"""What every page and action shares: sign-in required, the person's own gRPC transport, the
CSRF check and bounded form parsing on every POST, the outcome shown after the redirect."""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from jinja2 import Environment
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.templating import Jinja2Templates

from coordinator.console import session
from coordinator.console.gateway import Gateway
from coordinator.console.session import Credentials, Flash
from coordinator.console.settings import ConsoleSettings
from coordinator.console.signed_out import SignedOut
from coordinator.errors import CoordinatorError
from coordinator.sdk._rpc import Rpc

Endpoint = Callable[[Request], Awaitable[Response]]
Context = dict[str, Any]
PageFn = Callable[[Request, Rpc, ConsoleSettings], "Context | Response"]
ActionFn = Callable[[Request, Mapping[str, str], Rpc], Flash]

PAGE_TOKEN_CHARS = 300
"""The longest page token a link carries on: longer than any the server issues (a ListEffects
token, the longest, is at most 210 characters); a cut token would be refused."""

# A form of the console has at most a handful of short fields.
_MAX_FIELDS = 12
_MAX_FIELD_BYTES = 4096


@dataclass
class Console:
    """The console's shared state (``app.state.console``)."""

    settings: ConsoleSettings
    gateway: Gateway
    templates: Jinja2Templates
    # Sessions ended by sign-out (console/signed_out.py).
    signed_out: SignedOut
    # Live event streams open now, and by person: token, else principal (event loop only).
    streams: int = field(default=0)
    streams_of: Counter[str] = field(default_factory=Counter)


def console_of(request: Request) -> Console:
    """The console this request reached."""
    console: Console = request.app.state.console
    return console


def idempotency_key() -> str:
    """A fresh key for one rendered form: submitting it twice applies the change once."""
    return f"console-{secrets.token_hex(16)}"


def render(request: Request, template: str, context: Context, status_code: int = 200) -> Response:
    """A page with what every page shows: who is signed in, the CSRF token, the last outcome."""
    console = console_of(request)
    credentials = session.current(request, console_of(request).signed_out)
    full = {
        "user": credentials.label if credentials else None,
        "csrf": session.csrf_token(request),
        "flash": session.pop_flash(request),
        "insecure": console.settings.insecure,
        "path": request.url.path,
        **context,
    }
    return console.templates.TemplateResponse(request, template, full, status_code=status_code)


def local_path(target: str, default: str) -> str:
    """``target`` if it is a path on this console (never another host), else ``default``."""
    parts = urlsplit(target)
    if not target.startswith("/") or target.startswith("//") or parts.scheme or parts.netloc:
        return default
    return target


def page(template: str, fn: PageFn) -> Endpoint:
    """A GET page: sign-in required; ``fn`` runs in a worker thread with the person's own
    transport and returns the template's context (or a response of its own). A refusal by the
    coordinator is shown on the page with its status code, not as a server error."""

    async def endpoint(request: Request) -> Response:
        credentials = session.current(request, console_of(request).signed_out)
        if credentials is None:
            back = quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
            return RedirectResponse(f"/signin?next={back}", status_code=303)
        console = console_of(request)
        try:
            result = await run_in_threadpool(_run_page, console, credentials, request, fn)
        except CoordinatorError as exc:
            return render(request, "refused.html", {"error": str(exc)}, status_code=502)
        if isinstance(result, Response):
            return result
        return render(request, template, result)

    return endpoint


def _run_page(
    console: Console, credentials: Credentials, request: Request, fn: PageFn
) -> Context | Response:
    with console.gateway.connect(credentials) as rpc:
        return fn(request, rpc, console.settings)


def attempt(call: Callable[[], Any]) -> tuple[Any, str | None]:
    """(reply, None), or (None, the refusal's message) when the coordinator refuses the call:
    for the parts of a page that one role may read and another may not."""
    try:
        return call(), None
    except CoordinatorError as exc:
        return None, str(exc)


async def read_form(request: Request) -> dict[str, str] | Response:
    """The POSTed form if it is bounded, same-origin and carries this session's CSRF token;
    else the 403/400 response that refuses it."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        return PlainTextResponse("refused: the form was posted from another site", 403)
    try:
        form = await request.form(
            max_files=0, max_fields=_MAX_FIELDS, max_part_size=_MAX_FIELD_BYTES
        )
    except HTTPException as exc:  # Starlette's parsers refuse past the bounds with a 400
        return PlainTextResponse(f"refused: malformed form ({exc.detail})", 400)
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    if not session.csrf_matches(request, fields.get("csrf", "")):
        return PlainTextResponse(
            "refused: missing or stale CSRF token; reload the page and submit again", 403
        )
    return fields


def action(fn: ActionFn) -> Endpoint:
    """A POST action: CSRF-checked, sign-in required; ``fn`` calls the coordinator with the
    person's own transport and says what came of it. A refusal becomes the flash's text
    (``STATUS: message``); either way the browser is sent back (POST/redirect/GET)."""

    async def endpoint(request: Request) -> Response:
        form = await read_form(request)
        if isinstance(form, Response):
            return form
        credentials = session.current(request, console_of(request).signed_out)
        if credentials is None:
            return PlainTextResponse("refused: sign in first", 401)
        console = console_of(request)
        flash = await run_in_threadpool(_run_action, console, credentials, request, form, fn)
        session.set_flash(request, flash)
        back = local_path(form.get("back", ""), "/inbox")
        return RedirectResponse(back, status_code=303)

    return endpoint


def _run_action(
    console: Console,
    credentials: Credentials,
    request: Request,
    form: Mapping[str, str],
    fn: ActionFn,
) -> Flash:
    try:
        with console.gateway.connect(credentials) as rpc:
            return fn(request, form, rpc)
    except CoordinatorError as exc:
        return Flash(ok=False, text=str(exc))


def jinja_environment(env: Environment) -> None:
    """Register the view helpers as filters of ``env``."""
    from coordinator.console import views

    env.filters["state"] = lambda v: views.name(v, "state")
    env.filters["end"] = lambda v: views.name(v, "end")
    env.filters["effect"] = lambda v: views.name(v, "effect")
    env.filters["when"] = views.when
    env.filters["duration"] = views.duration
    env.filters["payload"] = views.payload
    env.filters["preview"] = views.preview
    env.filters["position"] = views.position_text
    env.globals["idem"] = idempotency_key


def page_token(request: Request, name: str) -> str:
    """The page token a "next page" link carried in query parameter ``name`` (bounded)."""
    return request.query_params.get(name, "")[:PAGE_TOKEN_CHARS]
