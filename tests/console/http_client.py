"""A plain HTTP client of the console (no browser): sign in, read a form's CSRF token, post."""

from __future__ import annotations

import re

import httpx


def csrf_of(html: str) -> str:
    """The CSRF token in a page's forms."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def signed_in(url: str, token: str) -> httpx.Client:
    """A client whose session is signed in with ``token``."""
    client = httpx.Client(base_url=url, follow_redirects=False, timeout=10.0)
    csrf = csrf_of(client.get("/signin").text)
    reply = client.post("/signin", data={"csrf": csrf, "token": token, "next": "/inbox"})
    assert (reply.status_code, reply.headers["location"]) == (303, "/inbox"), reply.text
    return client
