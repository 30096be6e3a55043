"""The console against ``coordinator up`` (insecure, embedded etcd): started without
--target it finds ``up`` and its insecure mode, and people sign in by naming a principal, which
every call made for them then carries (the accept below is recorded as theirs)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx

from coordinator.sdk import Claim, Outcome, TaskState, WorkerClient
from tests.conftest import GRPC_OPTIONS
from tests.console.conftest import console_process, flash_text
from tests.console.http_client import csrf_of
from tests.test_cli import Process


def _review_task(target: str, task_id: str) -> None:
    """pm-1 creates a task that needs review; worker-x commits it (named callers: insecure)."""
    with WorkerClient(target, principal="pm-1", channel_options=GRPC_OPTIONS) as pm:
        pm.create_task(task_id, input=b"draft", requires_review=True)
    with WorkerClient(target, principal="worker-x", channel_options=GRPC_OPTIONS) as worker:
        claim = worker.claim(task_id, ttl=timedelta(seconds=30))
        assert isinstance(claim, Claim), claim
        with claim:
            assert claim.commit(b"the report").outcome is Outcome.COMMITTED


def test_against_up_people_sign_in_by_naming_a_principal(tmp_path: Path) -> None:
    up = Process(["up", "--listen", "127.0.0.1:0"], tmp_path / "up.log")
    try:
        target = up.expect(r"listening on (\S+)")[1]
        _review_task(target, "r-1")
        with console_process([], tmp_path) as url:  # no --target: it finds `up`
            client = httpx.Client(base_url=url, follow_redirects=False, timeout=10.0)
            form = client.get("/signin").text
            assert 'id="principal"' in form and 'id="token"' not in form
            reply = client.post(
                "/signin", data={"csrf": csrf_of(form), "principal": "reviewer-1", "next": "/inbox"}
            )
            assert (reply.status_code, reply.headers["location"]) == (303, "/inbox")
            inbox = client.get("/inbox").text
            assert '<span class="who">reviewer-1</span>' in inbox
            assert 'data-task="r-1"' in inbox

            accepted = client.post(
                "/tasks/r-1/accept", data={"csrf": csrf_of(inbox), "revision": "1"}
            )
            assert accepted.status_code == 303
            assert flash_text(client.get("/inbox").text) == "accepted revision 1 of r-1: now DONE"
            events = client.get("/events?task=r-1").text
            row = events.split("REVIEW → DONE", 1)[1].split("</tr>", 1)[0]
            assert '<td data-label="by">reviewer-1</td>' in row  # the named principal acted
        with WorkerClient(target, principal="pm-1", channel_options=GRPC_OPTIONS) as pm:
            assert pm.get_task("r-1").state is TaskState.DONE
        assert up.terminate() == 0, up.logs()
    finally:
        up.kill()
