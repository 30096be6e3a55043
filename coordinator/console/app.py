"""The console's ASGI application: routes, the signed session cookie, the request bounds."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from coordinator.console.gateway import Gateway
from coordinator.console.guards import Guards
from coordinator.console.hosts import HostGuard, HostPolicy
from coordinator.console.routes import actions, claims, events, inbox, queues, signin, task
from coordinator.console.routes.common import Console, action, jinja_environment, page
from coordinator.console.settings import ConsoleSettings
from coordinator.console.signed_out import SignedOut

_HERE = Path(__file__).parent
SESSION_COOKIE = "coordinator_console"
MIN_SECRET_CHARS = 32


async def _home(request: Request) -> Response:
    return RedirectResponse("/queues", status_code=303)


def build_app(settings: ConsoleSettings) -> Starlette:
    """The console for ``settings`` (ValueError for a secret key too short to sign with)."""
    if len(settings.secret_key) < MIN_SECRET_CHARS:
        raise ValueError(f"the session secret must be at least {MIN_SECRET_CHARS} characters")
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"),
        autoescape=select_autoescape(default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    jinja_environment(env)
    routes = [
        Route("/", _home),
        Route("/signin", signin.signin_form, methods=["GET"]),
        Route("/signin", signin.signin, methods=["POST"]),
        Route("/signout", signin.signout, methods=["POST"]),
        Route("/queues", page("queues.html", queues.queues)),
        Route("/tasks", page("tasks.html", queues.tasks)),
        Route("/claims", page("claims.html", claims.claims)),
        Route("/tasks/{task_id}", page("task.html", task.task)),
        Route("/inbox", page("inbox.html", inbox.inbox)),
        Route("/events", page("events.html", events.events)),
        Route("/events/stream", events.stream),
        Route("/tasks/{task_id}/accept", action(actions.accept), methods=["POST"]),
        Route("/tasks/{task_id}/reject", action(actions.reject), methods=["POST"]),
        Route("/tasks/{task_id}/approve", action(actions.approve), methods=["POST"]),
        Route("/effects/{effect_id}/resolve", action(actions.resolve), methods=["POST"]),
        Route("/queues/{queue}/retry-failed", action(actions.retry_failed), methods=["POST"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    middleware = [
        Middleware(
            HostGuard,
            policy=HostPolicy(insecure=settings.insecure, allowed=settings.allowed_hosts),
        ),
        Middleware(Guards, max_body_bytes=settings.max_body_bytes),
        Middleware(
            SessionMiddleware,
            secret_key=settings.secret_key,
            session_cookie=SESSION_COOKIE,
            max_age=settings.session_seconds,
            same_site="strict",
            https_only=settings.secure_cookie,
        ),
    ]
    app = Starlette(routes=routes, middleware=middleware)
    app.state.console = Console(
        settings=settings,
        gateway=Gateway(settings),
        templates=Jinja2Templates(env=env),
        signed_out=SignedOut(lifetime=settings.session_seconds),
    )
    return app
