"""The console over plain HTTP: sign-in, the session cookie's flags, and every refusal of a
request that lacks sign-in, a CSRF token or a sane size. A refused action must change nothing
on the coordinator, which is checked there."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import httpx

from coordinator.sdk import TaskState
from coordinator.v1 import admin_pb2, admin_pb2_grpc
from tests.console.conftest import Stack, flash_text
from tests.console.http_client import csrf_of, signed_in


def test_pages_need_sign_in_and_the_stream_too(stack: Stack) -> None:
    client = httpx.Client(base_url=stack.url, follow_redirects=False)
    for path in ("/queues", "/claims", "/inbox", "/events", "/tasks/t-1"):
        reply = client.get(path)
        assert (reply.status_code, reply.headers["location"]) == (
            303,
            f"/signin?next={path}",
        )
    assert client.get("/events/stream").status_code == 401


def test_a_bad_token_is_refused_with_the_servers_message(stack: Stack) -> None:
    client = httpx.Client(base_url=stack.url, follow_redirects=False)
    csrf = csrf_of(client.get("/signin").text)
    reply = client.post("/signin", data={"csrf": csrf, "token": "not-a-token"})
    assert reply.status_code == 401
    assert "UNAUTHENTICATED: unknown or revoked bearer token" in reply.text
    assert client.get("/queues").status_code == 303  # still signed out


def test_the_session_cookie_is_signed_httponly_and_strict(stack: Stack) -> None:
    client = httpx.Client(base_url=stack.url, follow_redirects=False)
    csrf = csrf_of(client.get("/signin").text)
    reply = client.post("/signin", data={"csrf": csrf, "token": stack.token("pm-1")})
    cookie = reply.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    name, _, value = reply.headers["set-cookie"].split(";")[0].partition("=")
    forged = httpx.Client(base_url=stack.url, follow_redirects=False)
    forged.cookies.set(name, value[:-2] + ("AA" if not value.endswith("AA") else "BB"))
    assert forged.get("/queues").status_code == 303  # a tampered cookie signs nobody in
    assert reply.headers["x-frame-options"] == "DENY"
    assert "script-src 'self'" in reply.headers["content-security-policy"]


def test_sign_in_itself_needs_the_csrf_token(stack: Stack) -> None:
    client = httpx.Client(base_url=stack.url, follow_redirects=False)
    client.get("/signin")
    reply = client.post("/signin", data={"token": stack.token("pm-1")})
    assert reply.status_code == 403
    assert "CSRF" in reply.text


def test_an_action_without_or_with_a_wrong_csrf_token_changes_nothing(stack: Stack) -> None:
    stack.review_task("t-1")
    client = signed_in(stack.url, stack.token("pm-1"))
    for form in ({"revision": "1"}, {"revision": "1", "csrf": "forged"}):
        reply = client.post("/tasks/t-1/accept", data=form)
        assert reply.status_code == 403
        assert "missing or stale CSRF token" in reply.text
    assert stack.state("t-1") == (TaskState.REVIEW, 1)


def test_a_post_from_another_origin_is_refused(stack: Stack) -> None:
    stack.review_task("t-1")
    client = signed_in(stack.url, stack.token("pm-1"))
    csrf = csrf_of(client.get("/inbox").text)
    reply = client.post(
        "/tasks/t-1/accept",
        data={"csrf": csrf, "revision": "1"},
        headers={"origin": "http://evil.example"},
    )
    assert reply.status_code == 403
    assert "another site" in reply.text
    assert stack.state("t-1") == (TaskState.REVIEW, 1)


def test_a_body_over_the_bound_is_refused_413(stack: Stack) -> None:
    client = signed_in(stack.url, stack.token("pm-1"))
    csrf = csrf_of(client.get("/inbox").text)
    reply = client.post(
        "/tasks/t-1/accept", data={"csrf": csrf, "revision": "1", "pad": "x" * 20_000}
    )
    assert reply.status_code == 413
    assert "request body over 16384 bytes" in reply.text


def test_accept_with_the_csrf_token_applies_and_shows_the_outcome(stack: Stack) -> None:
    stack.review_task("t-1")
    client = signed_in(stack.url, stack.token("pm-1"))
    csrf = csrf_of(client.get("/inbox").text)
    reply = client.post(
        "/tasks/t-1/accept", data={"csrf": csrf, "revision": "1", "back": "//evil.example/x"}
    )
    assert (reply.status_code, reply.headers["location"]) == (303, "/inbox")  # never off-site
    assert flash_text(client.get("/inbox").text) == "accepted revision 1 of t-1: now DONE"
    assert stack.state("t-1") == (TaskState.DONE, 1)


def test_signing_out_ends_the_session(stack: Stack) -> None:
    client = signed_in(stack.url, stack.token("pm-1"))
    csrf = csrf_of(client.get("/queues").text)
    assert client.post("/signout", data={"csrf": csrf}).status_code == 303
    assert client.get("/queues").status_code == 303


def test_the_queues_page_counts_delayed_tasks_and_marks_a_paused_queue(stack: Stack) -> None:
    with stack.client("pm-1") as pm:
        later = datetime.now(UTC) + timedelta(hours=1)
        pm.create_task("later-1", queue="reports", input=b"in", not_before=later)
        pm.create_task("now-1", queue="emails", input=b"in")
    with stack.stubs("admin-1") as admin, grpc.insecure_channel(stack.target) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        request = admin_pb2.PauseClaimsRequest(queue="reports")
        stub.PauseClaims(request, metadata=admin.metadata)
    page = signed_in(stack.url, stack.token("pm-1")).get("/queues").text
    row = page.split('href="/tasks?queue=reports"', 1)[1].split("</tr>", 1)[0]
    assert "PAUSED" in row
    assert (
        'data-label="delayed" class="num"><a href="/tasks?queue=reports&amp;state=DELAYED">1<'
        in row
    )
    assert 'id="paused-queues">reports<' in page
