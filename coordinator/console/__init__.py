"""The web console (``coordinator console``): a gRPC client with pages for the people who watch
pools and approve work - queues, live claims, a task's history, the review and approval inbox,
and the live event log.

It holds no privilege of its own. Each person signs in with their own bearer token (or, against
an insecure server, names a principal); the token lives in their signed, HttpOnly, SameSite=Strict
session cookie and rides on every gRPC call made for them, so the server's role table decides
what they may see and do. Needs the ``console`` extra (Starlette, Jinja2, uvicorn).
"""

from coordinator.console.app import build_app
from coordinator.console.settings import ConsoleSettings

__all__ = ["ConsoleSettings", "build_app"]
