"""The console over plain HTTP: sign-in, the session cookie's flags, and every refusal of a
request that lacks sign-in, a CSRF token or a sane size. A refused action must change nothing
on the coordinator, which is checked there."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from functools import partial

import grpc
import httpx

from coordinator.sdk import TaskState
from coordinator.store import EventFilter, Store
from coordinator.v1 import admin_pb2, admin_pb2_grpc, tasks_pb2
from tests.console.conftest import Stack, flash_text
from tests.console.http_client import csrf_of, signed_in
from tests.helpers import eventually
from tests.store.support import create, in_one_revision


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


def test_approve_or_resolve_without_a_resolution_is_refused_and_changes_nothing(
    stack: Stack,
) -> None:
    """The form pre-selects nothing; a post that chose nothing (a script, an old page) is
    refused by the console itself with what to choose, before any call."""
    stack.review_task("t-1")
    client = signed_in(stack.url, stack.token("admin-1"))
    csrf = csrf_of(client.get("/inbox").text)
    for path in ("/tasks/t-1/approve", "/effects/e-1/resolve"):
        reply = client.post(path, data={"csrf": csrf, "back": "/inbox"})
        assert reply.status_code == 303
        assert flash_text(client.get("/inbox").text) == (
            "choose what happened downstream: committed (it happened: skip it) or absent (it "
            "did not: send again); nothing was changed"
        )
    assert stack.state("t-1") == (TaskState.REVIEW, 1)


def test_signing_out_ends_the_session(stack: Stack) -> None:
    client = signed_in(stack.url, stack.token("pm-1"))
    csrf = csrf_of(client.get("/queues").text)
    copied = httpx.Client(base_url=stack.url, follow_redirects=False, cookies=client.cookies)
    assert copied.get("/queues").status_code == 200  # a copy of the cookie works while signed in
    other = signed_in(stack.url, stack.token("pm-1"))  # another session of the same person
    assert client.post("/signout", data={"csrf": csrf}).status_code == 303
    assert client.get("/queues").status_code == 303
    # The copied cookie is refused server-side now, not only cleared in the browser.
    assert copied.get("/queues").headers["location"] == "/signin?next=/queues"
    assert other.get("/queues").status_code == 200


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


def _sse_ids(client: httpx.Client, last_event_id: str, count: int) -> list[str]:
    """The ids of the first ``count`` task events the live stream sends when a browser
    reconnects with ``Last-Event-ID``."""
    ids: list[str] = []
    headers = {"last-event-id": last_event_id}
    with client.stream("GET", "/events/stream", headers=headers, timeout=15.0) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("id: "):
                ids.append(line.removeprefix("id: "))
                if len(ids) == count:
                    break
    return ids


def test_a_stream_resumed_inside_a_shared_revision_sends_the_rest_of_it_once(
    stack: Stack, store: Store
) -> None:
    # Three creates in one etcd revision (group commit), so their events share it: only the
    # position (revision, task, state version) tells them apart.
    in_one_revision(store, [partial(create, store, name) for name in ("a", "b", "c")])
    shared = {event.position.revision for event in store.events.history(EventFilter())}
    (revision,) = shared
    client = signed_in(stack.url, stack.token("pm-1"))
    page = client.get("/events").text
    # Newest first: within one revision too, the reverse of the position order.
    assert [f"{revision}/{t}/0" for t in "cba"] == re.findall(r'data-position="([^"]+)"', page)

    with stack.client("pm-1") as pm:  # after the browser's connection dropped
        pm.create_task("d", queue="q", input=b"later")
    resumed = _sse_ids(client, f"{revision}/b/0", count=2)
    assert resumed[0] == f"{revision}/c/0"  # the rest of b's revision: c, not a or b again
    assert resumed[1].endswith("/d/0") and int(resumed[1].split("/")[0]) > revision


def test_the_task_page_draws_its_upstreams_and_dependents_with_their_states(
    stack: Stack,
) -> None:
    with stack.stubs("pm-1") as pm:
        for task_id, upstreams in [("fetch", ()), ("clean", ()), ("merge", ("fetch", "clean"))]:
            request = tasks_pb2.CreateTaskRequest(task_id=task_id, input=b"i", depends_on=upstreams)
            pm.tasks.CreateTask(request, metadata=pm.metadata)
        request = tasks_pb2.CreateTaskRequest(task_id="report", input=b"i", depends_on=["merge"])
        pm.tasks.CreateTask(request, metadata=pm.metadata)
    stack.commit("clean", b"ok")
    page = signed_in(stack.url, stack.token("worker-a")).get("/tasks/merge").text
    graph = page.split('id="graph"', 1)[1].split("<section", 1)[0]

    def nodes(column: str) -> list[tuple[str, str]]:
        part = graph.split(f'id="{column}"', 1)[1].split("</ul>", 1)[0]
        return re.findall(r'data-task="([^"]+)">.*?class="state s-(\w+)"', part)

    assert nodes("upstreams") == [("fetch", "READY"), ("clean", "DONE")]  # depends_on order
    assert nodes("dependents") == [("report", "WAITING")]
    assert '<strong class="mono">merge</strong> <span class="state s-WAITING">' in graph


def test_the_task_page_and_lists_mark_a_dependent_blocked_by_a_cancelled_upstream(
    stack: Stack,
) -> None:
    with stack.stubs("pm-1") as pm:
        for task_id, upstreams in [("fetch", ()), ("merge", ("fetch",))]:
            request = tasks_pb2.CreateTaskRequest(task_id=task_id, input=b"i", depends_on=upstreams)
            pm.tasks.CreateTask(request, metadata=pm.metadata)
        cancel = tasks_pb2.CancelTaskRequest(task_id="fetch", reason="dropped")
        pm.tasks.CancelTask(cancel, metadata=pm.metadata)
    client = signed_in(stack.url, stack.token("pm-1"))
    page = eventually(
        lambda: text if "task-blocked" in (text := client.get("/tasks/merge").text) else None
    )
    assert re.search(r'id="task-blocked"[^>]*>blocked by fetch</span>', page)
    assert 'id="task-overdue"' not in page  # no deadline passed
    queues = eventually(
        lambda: text if "s-blocked" in (text := client.get("/queues").text) else None
    )
    assert '<a class="state s-blocked" href="/tasks?queue=default&amp;blocked=1">1 blocked</a>' in (
        queues
    )
    listed = client.get("/tasks?blocked=1").text
    assert re.findall(r'<a href="/tasks/([^"]+)">', listed) == ["merge"]
    assert '<span class="state s-WAITING">WAITING</span> <span class="state s-blocked">blocked' in (
        listed
    )


def test_one_person_holds_at_most_two_live_streams_and_another_still_gets_one(
    stack: Stack,
) -> None:
    """A worker holding all 8 of the console's live streams unread (and reopening each as it
    timed out) locked every other user's live view out with 503."""
    hog = signed_in(stack.url, stack.token("worker-a"))
    with (
        hog.stream("GET", "/events/stream", timeout=15.0) as first,
        hog.stream("GET", "/events/stream", timeout=15.0) as second,
    ):
        assert (first.status_code, second.status_code) == (200, 200)
        third = hog.get("/events/stream", timeout=15.0)
        assert third.status_code == 503
        token = stack.token("worker-a")
        assert third.text == (
            f"token …{token[-4:]} has 2 live streams open, the most one person may: close "
            "another tab's live view; retrying shortly"
        )
        other = signed_in(stack.url, stack.token("pm-1"))
        with other.stream("GET", "/events/stream", timeout=15.0) as theirs:
            assert theirs.status_code == 200
