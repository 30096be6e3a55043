"""Sign in (paste a bearer token, or name a principal on an insecure server) and sign out.

A token is checked before it is kept: the console calls GetEpoch (open to every role) with it,
so a mistyped or revoked token is refused here with the server's UNAUTHENTICATED message
rather than on every page after."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from coordinator.console import session
from coordinator.console.routes.common import console_of, local_path, read_form, render
from coordinator.console.session import Credentials
from coordinator.errors import CoordinatorError
from coordinator.v1 import admin_pb2


async def signin_form(request: Request) -> Response:
    """The sign-in page."""
    return render(request, "signin.html", {"next": request.query_params.get("next", "/")})


async def signin(request: Request) -> Response:
    """Check the credentials with the coordinator, then start the session."""
    form = await read_form(request)
    if isinstance(form, Response):
        return form
    console = console_of(request)
    back = local_path(form.get("next", ""), "/")
    try:
        if console.settings.insecure:
            credentials = session.principal_credentials(form.get("principal", ""))
        else:
            credentials = session.token_credentials(form.get("token", ""))
        await run_in_threadpool(_probe, request, credentials)
    except CoordinatorError as exc:
        context = {"next": back, "error": str(exc)}
        return render(request, "signin.html", context, status_code=401)
    session.sign_in(request, credentials)
    return RedirectResponse(back, status_code=303)


def _probe(request: Request, credentials: Credentials) -> None:
    gateway = console_of(request).gateway
    with gateway.connect(credentials) as rpc:
        rpc.call(rpc.admin.GetEpoch, admin_pb2.GetEpochRequest(), retry=False)


async def signout(request: Request) -> Response:
    """End the session (a CSRF-checked POST: a link elsewhere cannot sign anyone out)."""
    form = await read_form(request)
    if isinstance(form, Response):
        return form
    session.sign_out(request, console_of(request).signed_out)
    return RedirectResponse("/signin", status_code=303)
